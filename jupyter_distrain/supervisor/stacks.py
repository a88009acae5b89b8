"""Taking every live process's stacks (``contract/stacks.py`` says how): on request
(``Op.STACKS``: the magic, the CLI, the REST API, the widget) and once per stall.

One collection runs at a time: a request arriving meanwhile gets the same report. The
supervisor signals each running member through its launcher handle, takes the answers
as they come (``Op.STACKS_TAKEN``), and ends the collection when all have answered or
``ANSWER_SECONDS`` have passed; the report is kept in ``logs/stacks/`` and handed to
whoever asked (as its file's name). A report taken at a stall goes into the stall's
warning, so the cell shows it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.process import ProcessId
from ..contract.stacks import (
    ANSWER_SECONDS,
    NATIVE_SECONDS,
    STACKS_SIGNAL,
    ProcessStacks,
    StacksReport,
)
from ..timing import Deadline
from . import events as ev
from .periodic import Periodic

if TYPE_CHECKING:
    from ..contract.launch import LaunchedProcess
    from .core import Supervisor
    from .table import Entry

log = logging.getLogger(__name__)


@dataclass
class Collection:
    """One collection under way: who was asked, what came back, who waits for it."""

    report: StacksReport
    asked: dict[ProcessId, Entry]
    answers: dict[ProcessId, ProcessStacks] = field(default_factory=dict)
    native: dict[ProcessId, str] | None = None  # py-spy's dumps, when asked for
    deadline: Deadline = field(default_factory=lambda: Deadline(ANSWER_SECONDS))
    waiting: list[Future[dict[str, Any]]] = field(default_factory=list)
    then: list[Callable[[StacksReport | None], None]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        native = self.native is None or len(self.native) == len(self.asked)
        return (len(self.answers) == len(self.asked) and native) or self.deadline.expired


class Stacks(Periodic):
    """The supervisor's stacks duty: at most one collection at a time."""

    interval = 0.0

    def __init__(self, supervisor: Supervisor):
        super().__init__(supervisor)
        self.current: Collection | None = None

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """What the loop does with the events of this duty."""
        return {
            ev.StacksRequested: lambda e: self.request("request", e.future, native=e.native),
            ev.StacksTaken: lambda e: self.taken(e.body),
            ev.NativeStackRead: lambda e: self.native_read(e.id, e.text),
        }

    def request(
        self,
        reason: str,
        future: Future[dict[str, Any]] | None = None,
        then: Callable[[StacksReport | None], None] | None = None,
        native: bool = False,
    ) -> None:
        """Start a collection (or join the one under way); ``future`` gets the name of
        the file keeping its report in ``logs/stacks/`` (``{"file": NAME}``: a report can
        outgrow a control reply), or the reason there is none; ``then`` is called with the
        report (None: no process was running to ask); ``native``: each process's native
        frames too, read by py-spy through its launcher (in threads: seconds each)."""
        if self.current is None:
            sup = self.supervisor
            asked = {
                entry.record.id: entry
                for entry in sup.table.live_members()
                if entry.record.state == "running" and entry.handle is not None
            }
            if not asked:
                if future is not None:
                    future.set_exception(RuntimeError("no process of the job is running yet"))
                if then is not None:
                    then(None)
                return
            self.current = Collection(StacksReport(sup.job.id, reason), asked)
            if native:
                self.current.native = {}
                self.current.deadline = Deadline(ANSWER_SECONDS + NATIVE_SECONDS)
                for pid, entry in asked.items():
                    threading.Thread(
                        target=self._read_native, args=(pid, entry.handle), daemon=True
                    ).start()
            for entry in asked.values():
                try:
                    entry.handle.signal(STACKS_SIGNAL)  # type: ignore[union-attr]
                except (OSError, RuntimeError) as exc:
                    log.warning("cannot ask %s for its stacks: %s", entry.record.id, exc)
        if future is not None:
            self.current.waiting.append(future)
        if then is not None:
            self.current.then.append(then)

    def taken(self, body: dict[str, Any]) -> None:
        """A worker's answer (control channel): kept when its collection is under way."""
        current = self.current
        pid = ProcessId.of(body)
        if current is None or pid is None or pid not in current.asked:
            return  # late, or from no process asked: nothing waits for it
        if not self.supervisor.worker.keys.proven(pid, body):
            log.warning("stacks for %s without its proof were dropped", pid)
            return
        try:
            stacks = ProcessStacks.from_dict(body["stacks"])
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("the stacks %s sent were not readable: %s", pid, exc)
            return
        record = current.asked[pid].record
        # who it is comes from the table, not from what the process says of itself
        stacks.process, stacks.name, stacks.host = str(pid), record.describe(), record.host
        stacks.pid = record.pid or stacks.pid
        current.answers[pid] = stacks
        if current.complete:
            self.finish()

    def _read_native(self, pid: ProcessId, handle: LaunchedProcess) -> None:
        """py-spy's dump of one process (a thread of its own), posted to the loop."""
        self.supervisor.inbox.post(ev.NativeStackRead(pid, handle.native_stack()))

    def native_read(self, pid: ProcessId, text: str) -> None:
        """A process's native frames (:meth:`_read_native`), kept when still wanted."""
        current = self.current
        if current is None or current.native is None or pid not in current.asked:
            return
        current.native[pid] = text
        if current.complete:
            self.finish()

    def run(self) -> None:
        if self.current is not None and self.current.complete:
            self.finish()

    def finish(self) -> None:
        current, self.current = self.current, None
        if current is None:
            return
        report = current.report
        for pid, entry in current.asked.items():
            answer = current.answers.get(pid)
            if answer is None:
                record = entry.record
                answer = ProcessStacks(
                    str(pid),
                    record.describe(),
                    record.host,
                    record.pid or 0,
                    error=f"no answer within {ANSWER_SECONDS:g} s: stopped, or its interpreter "
                    "is held by native code (py-spy dump --native shows native frames)",
                )
            if current.native is not None:
                answer.native = current.native.get(pid, "native frames: py-spy did not answer")
            report.processes.append(answer)
        sup = self.supervisor
        path = sup.job.write_stacks(report)
        sup.job.append_event("stacks", reason=report.reason, file=path.name)
        for then in current.then:
            then(report)
        for future in current.waiting:
            if not future.done():
                future.set_result({"file": path.name})

    def abandon(self, why: str) -> None:
        """The job ended: whoever waits is told so (a stall's warning is said alone)."""
        current, self.current = self.current, None
        if current is None:
            return
        for then in current.then:
            then(None)
        for future in current.waiting:
            if not future.done():
                future.set_exception(RuntimeError(why))
