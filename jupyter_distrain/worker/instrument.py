"""What a training program can call inside a job (all no-ops outside one).

- :func:`report` records one step of a custom training loop;
- :func:`timed_step` times a step and reports it;
- :func:`checkpoint_dir` is where to save what a restart resumes from;
- :func:`should_checkpoint` says that the supervisor asked for a checkpoint
  (to scale the job): save, then ``raise SystemExit(CHECKPOINT_EXIT)``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..contract.metrics import reporter
from ..contract.process import CHECKPOINT_EXIT, WorkerChannels

__all__ = ["CHECKPOINT_EXIT", "checkpoint_dir", "report", "should_checkpoint", "timed_step"]

_checkpoint_requested = False
_last_report = {"step": 0, "time": 0.0}
_reported_by_program = [False]


RATE_WINDOW_SECONDS = 3.0


class RateWindow:
    """Images/sec over the last few seconds of steps, gaps between steps included.

    One step's own time swings with the collective it waits in (rank 0 may wait for
    rank 1 in one step and rank 1 for rank 0 in the next), so two ranks in lock-step
    showed 4,757 and 8,126 images/sec side by side; over a window they agree."""

    def __init__(self, seconds: float = RATE_WINDOW_SECONDS):
        self.seconds = seconds
        self.steps: deque[tuple[float, float, float]] = deque()  # (end, images, duration)
        self.images = 0.0  # in the window: a running sum, so a step costs O(1)

    def add(self, end: float, images: float, duration: float) -> float:
        """Record a step that ended at ``end`` (monotonic seconds); the windowed rate."""
        self.steps.append((end, images, duration))
        self.images += images
        while len(self.steps) > 1 and end - self.steps[1][0] >= self.seconds:
            self.images -= self.steps.popleft()[1]
        first_end, _, first_duration = self.steps[0]
        span = end - (first_end - first_duration)
        return self.images / span if span > 0 else 0.0


_rates = RateWindow()


def request_checkpoint(*_: Any) -> None:
    """The worker bootstrap's SIGUSR1 handler."""
    global _checkpoint_requested
    _checkpoint_requested = True


def should_checkpoint() -> bool:
    """Whether the supervisor asked this process to checkpoint and exit (to rescale)."""
    return _checkpoint_requested


def checkpoint_dir() -> Path:
    """The job's ``checkpoints/`` directory (a temporary one outside a job)."""
    from ..contract.store import JobDir

    channels = WorkerChannels.from_env()
    path = JobDir(channels.job_dir).checkpoints_dir if channels else Path.cwd() / "checkpoints"
    path.mkdir(parents=True, exist_ok=True)
    return path


def report(
    step: int | None = None,
    images: int | None = None,
    loss: float | None = None,
    seconds: float | None = None,
    **scalars: float,
) -> None:
    """Record one training step. ``images`` over ``seconds`` (default: the time since the
    previous report) gives images/sec; ``loss`` and any other scalars are stored as given."""
    _reported_by_program[0] = True
    record_step(step, images, loss, seconds, **scalars)


def continue_steps_from(step: int) -> None:
    """Number the next step reported ``step + 1`` (a job resumed from a checkpoint)."""
    _last_report["step"] = step


def reported_by_program() -> bool:
    """Whether the program reports its steps itself (the framework hooks then do not)."""
    return _reported_by_program[0]


def record_step(
    step: int | None = None,
    images: int | None = None,
    loss: float | None = None,
    seconds: float | None = None,
    **scalars: float,
) -> None:
    """:func:`report` for the framework hooks (it does not mark the program as reporting)."""
    sender = reporter()
    now = time.time()
    step = _last_report["step"] + 1 if step is None else step
    if seconds is None and _last_report["time"]:
        seconds = now - _last_report["time"]
    _last_report.update(step=step, time=now)
    if sender is None:
        return
    record: dict[str, Any] = {"step": step, "time": now, **scalars}
    if seconds:
        record["step_seconds"] = seconds  # the views name a rank whose steps take longer
    if images is not None:
        record["images"] = images
        if seconds:
            record["images_per_sec"] = _rates.add(time.perf_counter(), images, seconds)
    if loss is not None:
        record["loss"] = float(loss)
    sender.report(record)


@contextmanager
def timed_step(images: int | None = None, step: int | None = None) -> Iterator[dict[str, Any]]:
    """``with timed_step(images=64) as s: ...; s["loss"] = loss`` reports the step."""
    values: dict[str, Any] = {}
    start = time.perf_counter()
    yield values
    report(step=step, images=images, seconds=time.perf_counter() - start, **values)
