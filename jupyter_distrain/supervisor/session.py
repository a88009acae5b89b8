"""A session's cells in the supervisor (``contract/session.py`` says how cells travel).

The duty keeps which ranks ran each recent cell and how (``Op.CELL_DONE``), answers the
notebook's ``Op.CELL_STATUS``, relays a new cell's files to the hosts whose processes
do not share the job directory (``Op.CELL``), and sends SIGINT to the ranks still in
a cell on ``Op.INTERRUPT``. When a rank's cell fails, the others still in it are
interrupted too (their next collective would wait for it for ever); a rank not back at
its prompt ``INTERRUPT_SECONDS`` after an interrupt is stuck (in a collective, most
often): the session fails, saying which ranks and where they are (their stacks). A
session ends with the kernel that started it, unless ``--keep-session``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import processes
from ..backends.base import Outcome, failed_first
from ..contract import session as cells
from ..contract.process import ProcessId
from ..contract.session import CellState
from .periodic import Periodic
from .policy import Fatal, Stopped

if TYPE_CHECKING:
    from ..contract.stacks import StacksReport
    from ..contract.status import ProcessRecord
    from .core import Supervisor
    from .table import Entry

log = logging.getLogger(__name__)

INTERRUPT_SECONDS = 10.0  # how long ranks have to come back to their prompt
KEPT_CELLS = 4  # the answers kept per session: the notebook asks about the latest


@dataclass
class CellPosted:
    """The notebook wrote cell ``index`` (control channel)."""

    index: int


@dataclass
class CellDone:
    """A rank ran a cell (control channel)."""

    body: dict[str, Any]


@dataclass
class CellStatusAsked:
    """The notebook asks which ranks ran cell ``index`` (answered through ``Request``)."""

    index: int


@dataclass
class CellResultAsked:
    """The notebook asks for the result ``process`` sent with its answer to cell ``index``."""

    index: int
    process: str


@dataclass
class InterruptRequested:
    """The notebook interrupted the running cell (control channel)."""

    reason: str = "interrupted from the notebook"


@dataclass
class _Cell:
    """What the supervisor knows of one cell."""

    posted: float = field(default_factory=time.monotonic)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)  # inline results, base64
    interrupted: float | None = None  # when its ranks were interrupted


class SessionCells(Periodic):
    """The supervisor's session duty (idle for a job that is not a session)."""

    interval = 0.5

    def __init__(self, supervisor: Supervisor):
        super().__init__(supervisor)
        self.active = supervisor.spec.session is not None
        self.cells: dict[int, _Cell] = {0: _Cell()}
        self.latest = 0
        self.failing = False
        # the kernel that started the session, known by its start time too (a pid reused
        # later is not it): read now, while the kernel waits for the session to start
        owner = supervisor.spec.owner_pid if not supervisor.spec.keep_session else 0
        self.owner = (owner, processes.start_time(owner)) if owner else None

    def handlers(self) -> dict[type, Callable[[Any], Any]]:
        """What the loop does with this duty's events."""
        return {
            CellPosted: lambda e: self.posted(e.index),
            CellDone: lambda e: self.done(e.body),
            CellStatusAsked: lambda e: self.answer(e.index),
            CellResultAsked: lambda e: self.result(e.index, e.process),
            InterruptRequested: lambda e: self.interrupt(e.reason),
        }

    def runners(self) -> list[Entry]:
        """The processes that run the session's cells (their hello said so)."""
        return [e for e in self.supervisor.table.members.values() if e.runs_cells]

    def busy_since(self) -> float | None:
        """Since when (monotonic) the latest cell runs; None when every rank is at its
        prompt (or this is not a session): a rank at its prompt takes no steps."""
        if not self.active:
            return None
        cell = self.cells.get(self.latest)
        return None if cell is None or self._finished(cell) else cell.posted

    def _finished(self, cell: _Cell) -> bool:
        runners = self.runners()
        return bool(runners) and all(str(e.record.id) in cell.answers for e in runners)

    def _cell(self, index: int) -> _Cell | None:
        """Cell ``index`` as known here; the next cell is known from its first answer
        too (a local rank may run a quick cell before the notebook's word of it comes)."""
        if index == self.latest + 1 and index not in self.cells:
            self.cells[index] = _Cell()
            for old in [i for i in self.cells if i <= index - KEPT_CELLS]:
                del self.cells[old]
        return self.cells.get(index)

    def posted(self, index: int) -> None:
        if not self.active or self._cell(index) is None or index < self.latest:
            raise ValueError(f"cell {index} is not the session's next cell")
        self.latest = index
        self._relay(lambda: cells.cell_files(self.supervisor.job.path, index))

    def _relay(self, files: Callable[[], dict[str, bytes]]) -> None:
        """The ``files`` (read only when needed: a cell's pushed values may be large) to
        each rank that runs in a job directory of its own (each rank's: a Ray slot has a
        directory of its own, and a rank's agent writes the files before it relays the
        signals sent after them)."""
        away = [e.handle for e in self.runners() if e.handle is not None and e.handle.own_job_dir]
        data = files() if away else {}
        for handle in away:
            if handle.alive:
                handle.receive_files(data)

    def done(self, body: dict[str, Any]) -> None:
        """A rank's answer, filed only when it proves it comes from the process it names
        (``contract/keys.py``: every rank holds the job's secret, not the others' keys)
        and answers a cell the notebook has written."""
        pid, index, state = ProcessId.of(body), body.get("cell"), body.get("state")
        entry = self.supervisor.table.entry(pid)
        if not isinstance(index, int) or entry is None or not entry.runs_cells:
            return
        if not self.supervisor.worker.keys.proven(entry.record.id, body):
            self._refuse(entry, index, "it does not carry that process's proof")
            return
        if index > self.latest and not cells.cell_file(self.supervisor.job.path, index).exists():
            self._refuse(entry, index, "the notebook has not written that cell")
            return
        cell = self._cell(index) if self.active else None
        key = str(entry.record.id)
        # a rank answers a cell once: a later answer (a retry, or after its failure an
        # "interrupted" from the mark) does not turn the cell's outcome into another
        if cell is None or not isinstance(state, str) or key in cell.answers:
            return
        answer = {"state": state}
        if state == CellState.ERROR:
            answer["error"] = str(body.get("error", ""))[: cells.ERROR_CHARS]
        if isinstance(body.get("digest"), str):
            answer["digest"] = body["digest"]
            if isinstance(body.get("result"), str):
                cell.results[key] = body["result"]
        cell.answers[key] = answer
        if state == CellState.ERROR and cell.interrupted is None and not self._finished(cell):
            self._interrupt(index, f"{entry.record.id.describe()}'s cell failed")

    def _refuse(self, entry: Entry, index: int, why: str) -> None:
        """An answer for ``entry`` that is not filed: said in the job's events and log."""
        name = entry.record.id.describe()
        log.warning("an answer for %s to cell %d was refused: %s", name, index, why)
        self.supervisor.job.append_event(
            "cell_answer_refused", process=str(entry.record.id), cell=index, reason=why
        )

    def answer(self, index: int) -> dict[str, Any]:
        """Which ranks ran cell ``index`` and how (``runners``: who runs cells), bounded
        whatever the number of ranks: the first failures' errors only, and no result
        (each is asked on its own: :meth:`result`)."""
        cell = self.cells.get(index)
        answers = {} if cell is None else cell.answers
        failed = sorted((p for p, a in answers.items() if "error" in a), key=ProcessId.parse)
        said = set(failed[: cells.ERRORS_SAID])
        return {
            "runners": sorted(str(e.record.id) for e in self.runners()),
            "answers": {
                p: a if p in said else {k: v for k, v in a.items() if k != "error"}
                for p, a in answers.items()
            },
        }

    def result(self, index: int, process: str) -> dict[str, Any]:
        """The result ``process`` sent inline with its answer to cell ``index``, if any."""
        cell = self.cells.get(index)
        inline = None if cell is None else cell.results.get(process)
        return {} if inline is None else {"result": inline}

    def interrupt(self, reason: str) -> None:
        cell = self.cells.get(self.latest)
        if cell is not None and not self._finished(cell):
            self._interrupt(self.latest, reason)

    def _interrupt(self, index: int, reason: str) -> None:
        """SIGINT to every rank still in cell ``index`` (the latest, or the next one when
        a rank's answer came before the notebook's word of it)."""
        cell = self.cells[index]
        cell.interrupted = time.monotonic()
        asked = [e for e in self.runners() if str(e.record.id) not in cell.answers]
        self.supervisor.job.append_event(
            "cell_interrupted", reason=reason, processes=[str(e.record.id) for e in asked]
        )
        # the mark first, then the signal: a rank that takes the cell after the signal
        # came (ignored at its prompt) sees the mark (the agent writes it before it signals)
        marked = cells.mark_interrupted(self.supervisor.job.path, index)
        self._relay(lambda: marked)
        for entry in asked:
            if entry.handle is not None:
                try:
                    entry.handle.signal(signal.SIGINT)
                except (OSError, RuntimeError) as exc:
                    log.warning("cannot interrupt %s: %s", entry.record.id, exc)

    def outcome(self, ended: ProcessRecord) -> Outcome | None:
        """A session's end when one of its processes ends (the others wait at their
        prompt for cells it will never run): failed when it failed, else succeeded
        (a cell's ``sys.exit(0)``); None for a job that is not a session."""
        if not self.active:
            return None
        return failed_first([ended], ended) if ended.exit_code else Outcome("succeeded")

    def run(self) -> None:
        sup = self.supervisor
        if not self.active or sup.status.done or self.failing:
            return
        if self.owner is not None and processes.same_process(*self.owner) is None:
            sup.policy.decide(Stopped(f"the kernel that started session {sup.spec.session} ended"))
            return
        if sup.status.state == "running" and not self.runners():  # every process is up
            sup.policy.decide(
                Fatal(
                    "no process of this session runs cells (its backend ran the program "
                    "in another mode): run it as a job, without --session"
                )
            )
            return
        cell = self.cells.get(self.latest)
        if cell is None or cell.interrupted is None or self._finished(cell):
            return
        if time.monotonic() - cell.interrupted < INTERRUPT_SECONDS:
            return
        stuck = [e.record.id for e in self.runners() if str(e.record.id) not in cell.answers]
        text = (
            f"{', '.join(p.describe() for p in stuck)} did not come back to the prompt within "
            f"{INTERRUPT_SECONDS:g} s of an interrupt (stuck in a collective or native code): "
            "the session is ended"
        )
        self.failing = True

        def end_with(report: StacksReport | None) -> None:
            sup.policy.decide(Fatal(_with_stacks(text, report)))

        sup.stacks.request("interrupt", then=end_with)


def _with_stacks(text: str, report: StacksReport | None) -> str:
    return text if report is None else f"{text}\n{report.text()}"
