"""The process table: every process of one generation of a job, keyed by ProcessId,
with its row (what state.json shows) and the launcher's handle on it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..contract.launch import LaunchedProcess
from ..contract.process import ProcessId
from ..contract.status import ProcessRecord


@dataclass
class Entry:
    record: ProcessRecord
    handle: LaunchedProcess | None = None  # None until started (or, if hosted, until hello)
    launched: bool = False  # started by our launcher (else adopted: it reports its own exit)
    host: ProcessId | None = None  # the helper that starts it (mpirun), if any
    last_heard: float | None = None  # monotonic time of its last hello, record or heartbeat
    last_step_at: float | None = None  # monotonic time its step last changed
    runs_cells: bool = False  # it runs a session's cells (its hello said so)


class ProcessTable:
    """Members (rows of the job) and helpers (processes that only start members)."""

    def __init__(self, generation: int = 0):
        self.generation = generation
        self.members: dict[ProcessId, Entry] = {}
        self.helpers: dict[ProcessId, Entry] = {}

    def entry(self, pid: ProcessId | None) -> Entry | None:
        if pid is None:
            return None
        return self.members.get(pid) or self.helpers.get(pid)

    def add(self, pid: ProcessId, host: str, rank: int | None, helper: bool = False) -> Entry:
        """A new row for ``pid``, replacing an ended one (a restarted elastic worker)."""
        record = ProcessRecord(pid.role, pid.index, host, rank, generation=self.generation)
        entry = Entry(record)
        (self.helpers if helper else self.members)[pid] = entry
        return entry

    def started(self, entry: Entry, handle: LaunchedProcess, log: str) -> None:
        entry.handle, entry.launched = handle, True
        entry.record.pid, entry.record.state = handle.pid, "starting"
        entry.record.create_time = handle.create_time
        entry.record.gpus = list(handle.gpus)
        entry.record.pooled = handle.pooled
        entry.record.started, entry.record.log = time.time(), log

    def take_late_reports(self) -> bool:
        """Copy into the rows what launchers learnt after a start returned (a host's
        agent reports its process's pid, start time and whether a pool gave it on its
        own connection, a Ray actor's start is not waited for), which a process's hello
        can beat; whether a row changed."""
        changed = False
        for entry in self.launched():
            handle, record = entry.handle, entry.record
            if handle is None or not handle.pid:
                continue
            if (record.pid, record.pooled) != (handle.pid, handle.pooled):
                record.pid, record.create_time = handle.pid, handle.create_time
                record.pooled = handle.pooled
                changed = True
        return changed

    def rows(self) -> list[ProcessRecord]:
        return [e.record for e in self.members.values()]

    def helper_rows(self) -> list[ProcessRecord]:
        return [e.record for e in self.helpers.values()]

    def launched(self) -> list[Entry]:
        """Every entry whose process our launcher started, helpers included."""
        return [e for e in [*self.members.values(), *self.helpers.values()] if e.launched]

    def live_members(self) -> list[Entry]:
        return [e for e in self.members.values() if e.record.live]

    def hosted_by(self, helper: ProcessId) -> list[Entry]:
        return [e for e in self.members.values() if e.host == helper]

    def not_up(self) -> list[ProcessId]:
        return [pid for pid, e in self.members.items() if e.record.state in ("pending", "starting")]

    def all_up(self) -> bool:
        return all(e.record.state == "running" for e in self.members.values())


def record_exit(record: ProcessRecord, code: int) -> bool:
    """Mark the row ended with ``code``; False if it had already ended."""
    if not record.live:
        return False
    record.exit_code = code
    record.state = "killed" if code < 0 else "exited"
    record.ended = time.time()
    return True
