"""The text views of a job: its summary line, the lines a reader of text gets while it
runs (:class:`SummaryLines`), and the terminal's view (:class:`TextSummary`)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ...contract.status import FINAL_STATES, JobStatus
from ..job import Job
from .model import JobModel, stragglers_text


def summary_line(model: JobModel) -> str:
    """The job in one line, saying what the widget says: state, processes up (or
    finished), step (of the total: progress), images/sec, ETA, stragglers."""
    done, eta = model.progress()
    steps = [p.step or 0 for p in model.processes()]
    rate, what = model.rate()
    slow = model.stragglers()
    return (
        f"[{model.job.id}] {model.status.state}: {model.processes_text()}, "
        f"step {max(steps, default=0)}"
        + (f"/{model.total_steps} ({done:.0%})" if model.total_steps else "")
        + f", {rate:,.0f} {what}"
        + (f", ETA {eta:.0f} s" if eta else "")
        + (f"; straggling: {stragglers_text(slow)}" if slow else "")
    )


class SummaryLines:
    """Summary lines for someone who reads text: one whenever the job's state changes,
    one every ``every`` seconds in between, and a final state's line once. ``out``
    defaults to ``sys.stdout`` as it is when a line is written (a kernel's cell stream)."""

    def __init__(self, every: float, out: TextIO | None = None):
        self.every = every
        self.out = out
        self._state = ""  # the state of the last line written
        self._written = 0.0  # and when (time.monotonic)

    def due(self, state: str, force: bool = False) -> bool:
        """Whether a line is due for a job in ``state`` (``force``: whatever the time)."""
        if state != self._state:
            return True
        if state in FINAL_STATES:
            return False
        return force or time.monotonic() - self._written >= self.every

    def write(self, model: JobModel) -> None:
        """Write the model's summary line now."""
        self._state, self._written = model.status.state, time.monotonic()
        print(summary_line(model), file=self.out or sys.stdout, flush=True)


class TextSummary:
    """The terminal's view: a line every few seconds and on each change of state, and
    one at the end."""

    def __init__(
        self, job: Job, every: float = 5.0, out: TextIO | None = None, from_start: bool = True
    ):
        self.model = JobModel(job, from_start)
        self.lines = SummaryLines(every, out)

    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
        """Print a line if one is due (``force``: whatever the time; the final one once)."""
        status = self.model.job.status() if status is None else status
        if self.lines.due(status.state, force):
            self.model.update(status)
            self.lines.write(self.model)
