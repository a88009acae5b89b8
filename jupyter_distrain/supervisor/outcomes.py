"""What the job's processes say and do, applied to the table: hello, bye, metrics and
exits; after each exit, the backend's rules decide whether the job has ended.

Design decision
---------------

- **Exit detection is immediate**: one thread per launched process blocks in
  `wait()` and posts the exit to the supervisor's inbox; the
  first failure is the earliest exit with a non-zero code, where a failure a
  worker reports in its `bye` (sent as its program ends, before Python's exit)
  counts as its exit: a framework's shutdown at exit can wait on the peers (JAX's
  did, for seconds), so the rank that raised could exit after the peer it failed
  and be taken for its victim (CI, once). A success still waits for the exit. A worker failing
  fails the job and stops the others in well under a second here (measured
  0.8 s from job start for a rank raising after 0.5 s).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract.launch import LaunchedProcess
from ..contract.process import CHECKPOINT_EXIT, ProcessId, metric_number
from ..contract.status import ProcessRecord
from ..contract.tail import last_lines
from ..timing import Deadline
from . import events as ev
from .policy import Failed, Succeeded
from .table import Entry, record_exit

TAIL_LINES = 20  # of the failing process's log, kept with the job's error

if TYPE_CHECKING:
    from .core import Supervisor

log = logging.getLogger(__name__)

LIVE_FIELDS = ("step", "images_per_sec", "loss", "total_steps")
# before a failure is decided, how long another member's death that is under way (a
# killed process still closing its sockets, its peer already failing on them) is waited for
EXITS_SETTLE_SECONDS = 0.25
EXITS_POLL_SECONDS = 0.02


class ProcessEvents:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.taking_exits = False  # within take_exits: the exits it applies take none

    def handlers(self) -> dict[type, Callable[[Any], Any]]:
        """What the loop does with the members' events."""
        return {
            ev.Exited: lambda e: self.on_exited(e.id, e.handle, e.code),
            ev.Hello: lambda e: self.on_hello(e.body),
            ev.Bye: lambda e: self.on_bye(e.body),
            ev.Metric: lambda e: self.on_metric(e.record, e.received),
        }

    def proven(self, body: dict[str, Any]) -> Entry | None:
        """The entry of the process a message names, when it carries that process's proof
        (``contract/keys.py``): a hello or a bye from anyone else (any holder of the job's
        secret) is logged and dropped."""
        sup = self.supervisor
        entry = sup.table.entry(ProcessId.of(body))
        if entry is None or sup.worker.keys.proven(entry.record.id, body):
            return entry
        log.warning("a %s for %s without its proof was dropped", body.get("op"), entry.record.id)
        return None

    def on_hello(self, body: dict[str, Any]) -> None:
        """A member is up. One that a helper started (an MPI rank) is adopted here."""
        sup = self.supervisor
        entry = self.proven(body)
        if entry is None or entry.host is None and entry.handle is None:
            return
        record = entry.record
        if entry.handle is None and isinstance(body.get("pid"), int) and sup.gen is not None:
            entry.handle = sup.gen.launcher.adopt(body["pid"], str(body.get("host", "")))
            if entry.handle is None:
                return  # gone already: its helper's exit will account for it
            record.pid, record.create_time = body["pid"], entry.handle.create_time
        if not record.pid and entry.handle is not None:  # a remote pid, known since start
            record.pid, record.create_time = entry.handle.pid, entry.handle.create_time
        if entry.handle is not None:  # a host's agent says it once the process runs
            record.pooled = entry.handle.pooled
        record.host = str(body.get("host") or record.host)
        record.address = str(body.get("address") or record.address)
        record.state = "running"
        entry.runs_cells = body.get("cells") is True and sup.spec.session is not None
        entry.last_heard = time.monotonic()
        sup.job.append_event("process_up", process=str(record.id), pid=record.pid)
        if sup.status.state == "launching" and sup.table.all_up():
            sup.status.running_at = time.time()
            ready = round(sup.status.running_at - (sup.status.created or 0), 3)
            sup.set_state("running", seconds_to_running=ready)
        else:
            sup.save()

    def on_bye(self, body: dict[str, Any]) -> None:
        """A member reports its exit code as its program ends, before Python's exit.

        One a helper started ends with it (no wait() of ours sees it), and so does a pooled
        one (its parent, the keeper, may be gone). One we started cold ends with it when it
        failed: its exit may come seconds later (JAX's and Horovod's shutdown at exit wait on
        the peers), and a peer failing because it left must not be taken for the first failure.
        A success (or a checkpoint) still waits for the exit, which wait() reports."""
        entry = self.proven(body)
        if entry is None or entry.handle is None:
            return
        code = body.get("code")
        if entry.handle.pid != body.get("pid") or not isinstance(code, int):
            return
        if entry.launched and not entry.handle.pooled and code in (0, CHECKPOINT_EXIT):
            return
        self.ended(entry.record, code)

    def on_exited(self, pid: ProcessId, handle: LaunchedProcess, code: int) -> None:
        table = self.supervisor.table
        entry = table.entry(pid)
        if entry is None or entry.handle is not handle:
            return  # a process of an earlier generation, already accounted for
        if code == -signal.SIGKILL and handle.oom_killed():
            entry.record.oom_killed = True
        if pid in table.helpers:
            record_exit(entry.record, code)
            hosted = [e.record for e in table.hosted_by(pid) if e.record.live]
            for record in hosted:  # members that said no bye end with their helper
                self.ended(record, code)
            return
        self.ended(entry.record, code)

    def take_exits(self, but: ProcessRecord) -> None:
        """Apply the exits of the members we launched (but ``but``) that have happened
        but that no waiter has posted yet (their handles' ``poll()`` gives the code; an
        adopted one's or a helper's may not know it before ``wait()``: left to it)."""
        self.taking_exits = True
        try:
            settle = Deadline(EXITS_SETTLE_SECONDS)
            while True:
                found = False
                for entry in self.supervisor.table.live_members():
                    handle = entry.handle
                    if handle is None or not entry.launched or entry.record is but:
                        continue
                    code = handle.poll()
                    if code is not None:
                        self.on_exited(entry.record.id, handle, code)
                        found = True
                if found or settle.expired:
                    return
                time.sleep(EXITS_POLL_SECONDS)
        finally:
            self.taking_exits = False

    def on_metric(self, record: dict[str, Any], received: float) -> None:
        entry = self.supervisor.table.entry(ProcessId.of(record))
        if entry is None:
            return
        entry.last_heard = max(entry.last_heard or 0.0, received)
        row = entry.record
        row.heartbeat = _or(metric_number(record.get("time")), row.heartbeat)
        if "step" in record:
            step = metric_number(record.get("step"))
            if step is not None and step != row.step:
                entry.last_step_at = received
            for name in LIVE_FIELDS:
                setattr(row, name, _or(metric_number(record.get(name)), getattr(row, name)))
        self.supervisor.dirty = True

    def ended(self, record: ProcessRecord, code: int) -> None:
        """Record a member's exit, then apply the scaling protocol or the backend's rules.
        A failure is decided only after the exits that have already happened elsewhere:
        a chief whose parameter server was killed fails at once, and its bye (or its
        waiter) can come before the killed server's waiter has said so; the job then
        names the server, the first to go, not the chief."""
        sup = self.supervisor
        # an exit that can decide no failure waits for none (a Stop ends every rank at once)
        quiet = sup.stopping or sup.status.done or sup.scaling.draining
        failing = code not in (0, CHECKPOINT_EXIT) and not (quiet or sup.scaling.leaving(record))
        if failing and record.live and not self.taking_exits:
            self.take_exits(but=record)
        if not record_exit(record, code):
            return
        leaving = sup.scaling.leaving(record)
        record.stopped = record.stopped or leaving  # removed by scaling down, not lost
        sup.job.append_event("exit", process=str(record.id), code=code)
        sup.save()
        if sup.stopping or sup.status.done or leaving:
            return
        if sup.scaling.draining or sup.scaling.checkpointed(code):
            sup.scaling.member_ended(record)
            return
        assert sup.gen is not None
        outcome = sup.gen.backend.outcome(sup.table.rows(), record) or sup.session.outcome(record)
        if outcome is None:
            if code:
                sup.job.append_event("process_lost", process=str(record.id), code=code)
            return
        if outcome.state == "failed":
            culprit = outcome.culprit
            tail = last_lines(sup.job.log_file(culprit.id), TAIL_LINES) if culprit else ""
            process = str(culprit.id) if culprit else None
            sup.policy.decide(Failed(outcome.error or "failed", tail, process))
            return
        if sup.table.live_members():
            sup.job.append_event("finishing", reason=f"{record.id} ended the job")
        sup.policy.decide(Succeeded())


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
