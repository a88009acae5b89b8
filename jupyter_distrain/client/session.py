"""Interactive sessions in the kernel: ``%%distributed --session NAME``.

The first cell with a session's name starts it: a job (``JobSpec.session``) whose ranks
run that cell as cell 0 and then wait at their prompt, their Python state kept. Each
later cell with the name is handed to the same ranks (``contract/session.py``) and
followed as a job is (its ranks' output, a widget of its own steps) until every rank has
run it. An interrupt raises ``KeyboardInterrupt`` in every rank's cell, and the session
lives on once they are all back at their prompt (a second interrupt stops it). A
session ends with its kernel unless started with ``--keep-session``; it is then found by
its name from any kernel of the same user.

Design decisions
----------------

- **A session is a job**: listed, followed, stopped, its stacks taken, its logs kept as
  any job's; its size and backend are fixed while it runs (a resize would restart the
  ranks and lose their state: it is refused, saying so).
- **Cells travel as files in the job directory** (polled by the ranks every 2 ms), not
  over the control channel: no size limit on a cell or its pushed values, nothing held
  open per rank, and the supervisor is told only to relay them to other hosts.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import pickle
import sys
import time
from typing import Any, TextIO

from ..contract import session as cells
from ..contract.process import ProcessId
from ..contract.session import Cell, CellState
from ..contract.spec import JobSpec, SpecError
from ..contract.status import JobStatus
from .follow import FollowOptions, View, refreshed
from .job import Job

FIRST_POLL_SECONDS = 0.002  # then twice as long each poll, up to a job's poll
_known: dict[str, Job] = {}  # session name -> its job, as found last


class CellFailed(RuntimeError):
    """A session's cell raised (or was interrupted) on some rank: one line in the cell
    (each rank's traceback is in its output above it)."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for custom display
        return [f"\x1b[0;31m{self}\x1b[0m"]


def find(name: str) -> Job | None:
    """The running session called ``name`` in this user's job store, if any."""
    known = _known.get(name)
    if known is not None and not known.done:
        return known
    for job in reversed(Job.list()):  # newest first
        status, spec = job.listed()
        if spec is not None and spec.session == name and not status.done:
            _known[name] = job
            return job
    return None


def owned(spec: JobSpec) -> JobSpec:
    """``spec`` with this process (the kernel) as the session's owner: the session ends
    with it, unless ``--keep-session``."""
    return spec if spec.keep_session else dataclasses.replace(spec, owner_pid=os.getpid())


def check_same(job: Job, spec: JobSpec) -> None:
    """Refuse a later cell whose line asks for another size or backend than the running
    session's (one line, nothing sent); a flag left at its default asks for nothing."""
    running, default = job.spec, JobSpec(code="")
    changed = [
        f"--{name} {getattr(spec, name)} (it has {getattr(running, name)})"
        for name in ("workers", "ps", "launcher", "backend")
        if getattr(spec, name) not in (getattr(default, name), getattr(running, name))
    ]
    if changed:
        raise SpecError(
            f"session {spec.session} (job {job.id}) is running; its size and backend stay as "
            f"they are while it runs: {', '.join(changed)}. Stop it to change them "
            f"(%distributed stop {job.id})"
        )


class CellRun:
    """One cell of a session, from its handing over to every rank's answer."""

    def __init__(self, job: Job, index: int, view: View | None, all_output: bool):
        self.job = job
        self.index = index
        self.interrupted = False
        self.answers: dict[str, dict[str, Any]] = {}
        self.options = FollowOptions(
            from_start=index == 0, all_output=all_output, until=self._finished
        )
        self.view = view
        self.run = self.options.run(job, view)
        self.pause = FIRST_POLL_SECONDS

    @classmethod
    def send(
        cls,
        job: Job,
        code: str,
        pushed: bytes | None,
        out: tuple[bool, bool],
        view: View | None,
        all_output: bool,
    ) -> CellRun:
        """Hand ``code`` to every rank of the running session ``job``; ``out``: (rank 0's
        ``result`` back, every rank's)."""
        index = next_index(job)
        run = cls(job, index, view, all_output)
        run.run.delay()  # the logs are read from here on: nothing the cell prints is missed
        cell = Cell(index, code, out[0] or out[1], out[1], pushed is not None)
        cells.write_cell(job.dir.path, cell, pushed)
        try:
            reply = job.request(cells.cell_request(index))
        except (OSError, RuntimeError) as exc:
            reply = {"ok": False, "error": str(exc)}
        # the ranks take the cell from its file, so one may have ended the session (a crash
        # in the cell) before the supervisor heard of it: the run then says how it ended
        if not reply.get("ok") and not job.done:
            raise SpecError(f"session {job.spec.session}: {reply.get('error')}")
        return run

    def _finished(self, status: JobStatus) -> bool:
        if status.state != "running":
            return False
        try:
            reply = self.job.request(cells.cell_status_request(self.index))
        except (OSError, RuntimeError):  # the session is ending: the next status says so
            return False
        runners, self.answers = reply.get("runners") or [], reply.get("answers") or {}
        return bool(runners) and set(runners) <= set(self.answers)

    def on_interrupt(self, out: TextIO) -> None:
        """The first interrupt: KeyboardInterrupt in every rank's cell; the second stops
        the session (raised on to the caller)."""
        name = self.job.spec.session
        if self.interrupted:
            print(f"Interrupted again: stopping session {name} ...", file=out, flush=True)
            self.job.stop()
            raise KeyboardInterrupt
        self.interrupted = True
        print(
            f"Interrupting cell {self.index} on every rank (again to stop session {name}) ...",
            file=out,
            flush=True,
        )
        self.job.tell(cells.interrupt_request())
        if self.run.watch.gi_frame is None:  # the interrupt landed inside the poll: again
            self.options = dataclasses.replace(self.options, from_start=False)
            self.run = self.options.run(self.job, self.view)

    def delay(self) -> float | None:
        """The next pause between polls: short at first (a quick cell returns in
        milliseconds, not one poll later), then a job's; None once the cell has run."""
        delay = self.run.delay()
        if delay is None:
            return None
        pause, self.pause = self.pause, min(self.pause * 2, delay)
        return min(pause, delay)

    def follow(self) -> str:
        """Wait (blocking) for every rank's answer; the job's state."""
        while True:
            try:
                while (delay := self.delay()) is not None:
                    time.sleep(delay)
                return self.ended()
            except KeyboardInterrupt:
                self.on_interrupt(sys.stdout)

    async def follow_async(self) -> str:
        """:meth:`follow` for an event loop (a kernel interrupts by cancelling)."""
        while True:
            try:
                while (delay := self.delay()) is not None:
                    await asyncio.sleep(delay)
                return self.ended()
            except asyncio.CancelledError:
                self.on_interrupt(sys.stdout)

    def ended(self) -> str:
        """The view's last refresh (the cell's steps); the job's state."""
        if self.view is not None:
            refreshed(self.view, force=True)
        return self.run.state

    def outcome(self, out: bool = False, every_rank: bool = False) -> list[Any]:
        """Rank 0's ``result`` sent back when the cell asked for it (``out``; with
        ``every_rank``: every rank's, in rank order); raises :class:`CellFailed` when the
        cell failed or was interrupted on some rank. A result is unpickled only from the
        process asked, and only when its bytes have the digest of that process's own
        answer (which the supervisor filed only with that process's proof)."""
        name = self.job.spec.session
        ranked = sorted(self.answers, key=ProcessId.parse)
        failed = [p for p in ranked if self.answers[p]["state"] == CellState.ERROR]
        if failed:
            first = self.answers[failed[0]]
            where = ProcessId.parse(failed[0]).describe()
            others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise CellFailed(
                f"cell {self.index} failed on {where}{others}: {first.get('error', '')}"
            )
        if any(self.answers[p]["state"] == CellState.INTERRUPTED for p in ranked):
            raise CellFailed(
                f"KeyboardInterrupt: cell {self.index} interrupted; every rank is back at its "
                f"prompt and session {name} goes on"
            )
        if not out:
            return []
        asked = ranked if every_rank else ranked[:1]  # rank 0 runs first: chief-0, worker-0
        sent = [self._result_data(p) for p in asked]
        return [pickle.loads(data)["value"] for data in sent if data is not None]

    def _result_data(self, process: str) -> bytes | None:
        """What ``process`` sent back, with the digest of its answer: its file here (a
        local rank), else what came inline with its answer (a rank on another host);
        None when neither (or the bytes are not what it said it sent)."""
        want = self.answers[process].get("digest")
        if not isinstance(want, str):
            return None
        pid = ProcessId.parse(process)
        try:
            data = cells.out_file(self.job.dir.path, self.index, pid).read_bytes()
        except FileNotFoundError:
            data = b""
        if cells.digest(data) == want:
            return data
        inline = self.job.request(cells.cell_result_request(self.index, pid)).get("result")
        data = base64.b64decode(inline) if isinstance(inline, str) else b""
        return data if cells.digest(data) == want else None


def next_index(job: Job) -> int:
    """The index the session's next cell takes."""
    found = [int(p.name.split(".")[0]) for p in cells.cells_dir(job.dir.path).glob("*.json")]
    return max(found, default=0) + 1
