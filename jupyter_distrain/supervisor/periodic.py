"""The supervisor's periodic duties, each a small object the loop ticks: the startup
deadline (``--timeout``), memory limits (``--memory``), sampling GPUs, hung processes
(``--hang-timeout``), a full disk, stalled training (``--stall-timeout``), the scale
timeout, reaping orphans, what hosts' agents reported after a hello, and saving live
metrics to state.json."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from ..timing import Deadline
from .policy import Failed, Fatal
from .table import record_exit

if TYPE_CHECKING:
    from ..contract.stacks import StacksReport
    from .core import Supervisor


class Periodic:
    """Runs :meth:`run` at most every ``interval`` seconds (0: on every tick)."""

    interval = 0.5

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.next = 0.0

    def tick(self, now: float) -> None:
        if now >= self.next:
            self.next = now + self.interval
            self.run()

    def run(self) -> None:
        raise NotImplementedError


class StartupDeadline(Periodic):
    """Fails the job when its processes are not all up within ``--timeout``."""

    interval = 0.0

    def __init__(self, supervisor: Supervisor):
        super().__init__(supervisor)
        self.deadline = Deadline(supervisor.spec.timeout)

    def restart(self) -> None:
        self.deadline = Deadline(self.supervisor.spec.timeout)

    def run(self) -> None:
        sup = self.supervisor
        if sup.status.state == "launching" and self.deadline.expired:
            missing = ", ".join(str(pid) for pid in sup.table.not_up())
            timeout = f"startup timeout: {missing} did not come up within {sup.spec.timeout:g} s"
            sup.policy.decide(Fatal(timeout))


class MemoryWatch(Periodic):
    """Samples each process's resident set (children included) into its row (what an
    OOM killer's victim held, said when it dies); kills one that exceeds ``--memory`` and
    fails the job naming it."""

    def run(self) -> None:
        sup = self.supervisor
        limit = sup.spec.memory * 2**30 if sup.spec.memory is not None else None
        for entry in sup.table.live_members():
            used = entry.handle.memory_bytes() if entry.handle else 0
            if used:
                entry.record.memory = used
            if limit is None or used <= limit:
                continue
            entry.handle.signal(signal.SIGKILL, tree=True)
            record_exit(entry.record, -signal.SIGKILL)
            pid = entry.record.id
            name = f"worker {pid.index}" if pid.role == "worker" else pid.describe()
            over = f"{name} exceeded {sup.spec.memory:.1f} GiB (resident {used / 2**30:.2f} GiB)"
            sup.policy.decide(Failed(over, process=str(pid)))
            return


class GpuWatch(Periodic):
    """Samples the utilisation and memory of each live process's GPUs (through its
    launcher, NVML on the local one) into its row; nothing without GPUs."""

    interval = 2.0

    def run(self) -> None:
        sup = self.supervisor
        if not sup.spec.gpus:
            return
        for entry in sup.table.live_members():
            usage = entry.handle.gpu_usage() if entry.handle else None
            if usage is not None:
                entry.record.gpu_percent = usage.percent
                entry.record.gpu_memory = usage.memory_bytes
                sup.dirty = True


class HangWatch(Periodic):
    """Fails the job when a running process goes unheard for ``--hang-timeout`` seconds:
    every worker's reporter sends a heartbeat each second, so silence means the process
    is stopped (SIGSTOP), frozen, or cut off."""

    interval = 1.0

    def run(self) -> None:
        sup = self.supervisor
        limit = sup.spec.hang_timeout
        if not limit or sup.status.state != "running":
            return
        now = time.monotonic()
        for entry in sup.table.live_members():
            if entry.record.state != "running" or entry.last_heard is None:
                continue
            silent = now - entry.last_heard
            if silent > limit:
                pid = entry.record.id
                unheard = (
                    f"{pid.describe()} stopped responding: nothing heard from it for "
                    f"{silent:.0f} s (--hang-timeout {limit:g})"
                )
                sup.policy.decide(Failed(unheard, process=str(pid)))
                return


class DiskWatch(Periodic):
    """Stops the job when the disk holding it is full: its logs and metrics could no
    longer be kept. The space set aside at start lets the final state be written."""

    interval = 0.0

    def run(self) -> None:
        sup = self.supervisor
        if sup.job.disk_full:
            sup.policy.decide(Fatal(f"disk full: {sup.job.disk_full}; the job was stopped"))


class StallWatch(Periodic):
    """Says (once per stall) when no rank's step has advanced for ``--stall-timeout``
    seconds while every process is alive: which ranks, at which steps, since when; then
    takes every rank's stacks, which the cell shows grouped (``supervisor/stacks.py``)."""

    interval = 1.0

    def __init__(self, supervisor: Supervisor):
        super().__init__(supervisor)
        self.warned_at: float | None = None  # the last step time the warning was about

    def run(self) -> None:
        sup = self.supervisor
        limit = sup.spec.stall_timeout
        stepping = [e for e in sup.table.live_members() if e.last_step_at is not None]
        if not limit or sup.status.state != "running" or not stepping:
            return
        busy_since = sup.session.busy_since()  # a session's ranks at their prompt take no steps
        if sup.session.active and busy_since is None:
            return
        latest = max(busy_since or 0.0, *(e.last_step_at or 0.0 for e in stepping))
        if time.monotonic() - latest <= limit or self.warned_at == latest:
            return
        self.warned_at = latest
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - latest)))
        stuck = ", ".join(f"{e.record.id.describe()} at step {e.record.step}" for e in stepping)
        text = f"training stalled: no step since {since} (over {limit:g} s): {stuck}"
        # said with where each rank stands, once their stacks are in (at most seconds)
        sup.stacks.request("stall", then=lambda report: sup.warn(stall_text(text, report)))


def stall_text(text: str, report: StacksReport | None) -> str:
    """A stall's warning: ``text``, then the ranks that stand apart and the grouped stacks."""
    if report is None:
        return text
    odd = report.odd_ones_out()
    apart = f"; {', '.join(odd)} stand{'s' if len(odd) == 1 else ''} apart" if odd else ""
    return f"{text}{apart}\n{report.text()}"


class ScaleTimeout(Periodic):
    """Checks a resize in progress: a drain that ran out, a request nobody answered."""

    def run(self) -> None:
        self.supervisor.scaling.expire()


class OrphanReaper(Periodic):
    """Collecting orphans scans /proc: rare work, kept off the hot path."""

    interval = 5.0

    def run(self) -> None:
        if self.supervisor.gen is not None:
            self.supervisor.gen.launcher.reap()


class LateReports(Periodic):
    """Rows take what launchers learnt after a start (:meth:`ProcessTable.take_late_reports`)
    while the job runs; every save takes them too."""

    def run(self) -> None:
        if self.supervisor.table.take_late_reports():
            self.supervisor.dirty = True


class Saver(Periodic):
    """Writes state.json when live metrics changed it since the last save."""

    def run(self) -> None:
        if self.supervisor.dirty:
            self.supervisor.save()


# what the loop ticks besides the startup deadline, the stacks and the saver (last)
WATCHES = (
    MemoryWatch,
    ScaleTimeout,
    OrphanReaper,
    HangWatch,
    StallWatch,
    DiskWatch,
    GpuWatch,
    LateReports,
)
