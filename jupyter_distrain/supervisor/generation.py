"""One generation of a job: its launcher, backend plan and process table, started and
stopped together. Scaling by checkpoint-and-restart replaces the generation."""

from __future__ import annotations

import logging
import signal
import threading
from collections import Counter
from collections.abc import Callable

from ..backends.base import Backend, JobHost, Plan, WorkerCommand
from ..contract.launch import LaunchedProcess, ProcessSpec
from ..contract.process import Env, ProcessId, identity_env
from ..contract.spec import JobSpec
from ..contract.store import JobDir
from ..launchers.base import Launcher
from ..plugins import BACKENDS, LAUNCHERS, load_plugin
from .events import Exited
from .table import Entry, ProcessTable, record_exit
from .termination import terminate

log = logging.getLogger(__name__)


def count_host_processes(processes: list[ProcessSpec]) -> None:
    """Tell each process how many of the plan's share its host (``Env.HOST_PROCESSES``:
    ``worker/threads.py`` gives each its share of the cores). Not a helper that starts
    members itself: mpirun binds its ranks to cores on its own."""
    placed = [(proc, proc.slot.host) for proc in processes if proc.slot and not proc.hosts]
    per_host = Counter(host for _, host in placed)
    for proc, host in placed:
        proc.env[Env.HOST_PROCESSES] = str(per_host[host])


class Generation:
    """Places slots, asks the backend for a plan, starts its processes, and stops them."""

    def __init__(
        self,
        number: int,
        spec: JobSpec,
        job: JobDir,
        worker: WorkerCommand,
        on_exit: Callable[[Exited], None],
        plugins: Callable[[str, str], type] = load_plugin,
    ):
        self.number = number
        self.spec = spec
        self.job = job
        self.worker = worker
        self.on_exit = on_exit
        self.table = ProcessTable(number)
        self.launcher: Launcher = plugins(LAUNCHERS, spec.launcher)(spec, job)
        self.backend: Backend = plugins(BACKENDS, spec.backend)(spec)
        self.plan: Plan | None = None
        self.pending: list[ProcessSpec] = []
        self.services_started = False
        self.stopped = False

    def prepare(self) -> Plan:
        """Place the slots and make the plan; its processes are started one at a time
        by :meth:`start_next`, so the loop stays free for a stop or a timeout."""
        slots = self.launcher.place(self.backend.slots_needed())
        self.plan = self.backend.prepare(slots, self.launcher, self.worker)
        self.pending = list(self.plan.processes)
        count_host_processes(self.pending)
        for proc in self.pending:
            self._row(proc)
            for member, slot in proc.hosts.items():
                entry = self.table.add(member, slot.host, member.index)
                entry.host, entry.record.address = proc.id, slot.address
        return self.plan

    @property
    def launching(self) -> bool:
        """Whether :meth:`start_next` has more to do."""
        return self.plan is not None and not self.services_started and not self.stopped

    def start_next(self, host: JobHost) -> None:
        """Start the next planned process; after the last, the plan's services."""
        if not self.launching:
            return
        if self.pending:
            self.start(self.pending.pop(0))
        if not self.pending:
            self.services_started = True
            assert self.plan is not None
            self.plan.services.start(host)

    def start(self, proc: ProcessSpec) -> LaunchedProcess:
        """Start one process of the plan (or of the backend's driver) and record it."""
        entry = self.table.entry(proc.id)
        if entry is None or entry.handle is not None:  # new, or a new one in an ended's slot
            entry = self._row(proc)
        proc.env.update(identity_env(proc.id, proc.slot.address if proc.slot else None))
        proc.env.update(self.worker.keys.env(proc.id, proc.hosts))
        log_path = self.job.log_file(proc.id)
        handle = self.launcher.start(proc, log_path)
        self.table.started(entry, handle, str(log_path.relative_to(self.job.path)))
        self.job.append_event("launch", process=str(proc.id), pid=handle.pid, rank=proc.rank)
        threading.Thread(target=self._wait, args=(entry, handle), daemon=True).start()
        return handle

    def _row(self, proc: ProcessSpec) -> Entry:
        host = proc.slot.host if proc.slot else "localhost"
        entry = self.table.add(proc.id, host, proc.rank, helper=bool(proc.hosts))
        entry.record.address = proc.slot.address if proc.slot else ""
        return entry

    def _wait(self, entry: Entry, handle: LaunchedProcess) -> None:
        self.on_exit(Exited(entry.record.id, handle, handle.wait()))

    def stop(self, grace: float) -> None:
        """Stop the services (so no driver starts anything new), then every process, and
        record how each ended. A second call does nothing."""
        if self.stopped:
            return
        self.stopped = True
        self.pending = []
        if self.plan is not None:
            self.plan.services.stop()
        terminate([e.handle for e in self.table.launched() if e.handle], grace)
        self.launcher.sweep()  # anything that escaped its process group, orphans included
        self.launcher.close()
        for entry in self.table.launched():
            code = entry.handle.poll() if entry.handle else None
            if code is not None:
                record_exit(entry.record, code)
        for record in [*self.table.rows(), *self.table.helper_rows()]:
            record_exit(record, -signal.SIGKILL)  # no exit code: it went with the rest

    def lost_hosts(self) -> dict[str, int]:
        """The hosts (nodes) its processes ended with, out of reach (asked once stopped),
        and how many of its processes each held."""
        handles = [e.handle for e in self.table.launched() if e.handle]
        held = Counter(h.host for h in handles)
        return {host: held[host] for host in sorted({h.host for h in handles if h.host_lost()})}

    def stop_members(self, ids: list[ProcessId], grace: float) -> None:
        """Stop these members only (those we launched; hosted ones go with their helper)."""
        for pid in ids:
            entry = self.table.entry(pid)
            if entry is not None:
                entry.record.stopped = True
        entries = [self.table.entry(pid) for pid in ids]
        terminate([e.handle for e in entries if e and e.launched and e.record.live], grace)

    @property
    def info(self) -> dict[str, object]:
        return self.plan.info if self.plan is not None else {}
