"""The terminal's view of a job: one summary line every few seconds, and one at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

from ...contract.status import FINAL_STATES, JobStatus
from ..job import Job
from .model import JobModel


def summary_line(model: JobModel) -> str:
    """The job in one line: state, processes up, step (of the total: progress),
    images/sec, ETA."""
    done, eta = model.progress()
    steps = [p.step or 0 for p in model.processes()]
    return (
        f"[{model.job.id}] {model.status.state}: {model.launch_progress()}, "
        f"step {max(steps, default=0)}"
        + (f"/{model.total_steps} ({done:.0%})" if model.total_steps else "")
        + f", {model.aggregate_images_per_sec():,.0f} images/sec"
        + (f", ETA {eta:.0f} s" if eta else "")
    )


class TextSummary:
    """The terminal's view: one line every few seconds, and one at the end."""

    def __init__(self, job: Job, every: float = 5.0, out: Any = None):
        self.model = JobModel(job)
        self.every = every
        self.out = out or sys.stdout
        self._last = 0.0
        self._printed_final = False

    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
        """Print a line if ``every`` seconds have passed (or ``force``); the final one once."""
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        self.model.update(status)
        state = self.model.status.state
        if state in FINAL_STATES:
            if self._printed_final:
                return
            self._printed_final = True
        print(
            summary_line(self.model),
            file=self.out,
            flush=True,
        )
