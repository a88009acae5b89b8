"""Following a job until it ends: its processes' output, a live view, a timeout, an interrupt.

There is one implementation, :func:`steps`: a generator that polls the job once per
step (one read of state.json and of the control file), prints every process's new
log lines with its label, ticks the view, and yields the seconds to sleep before the
next poll; it returns the job's final state. Two drivers run it: :func:`follow`
blocks (``time.sleep``) and :func:`follow_async` awaits (``asyncio.sleep``), so a
kernel's event loop stays free between polls. Both apply the same interrupt policy.

Design decision
---------------

- **The supervisor is detached from the kernel** (`start_new_session`), so the
  kernel's interrupt (SIGINT to its process group) never reaches the job
  directly: the cell's follow (`follow.py`) catches `KeyboardInterrupt` (or the
  async cell's cancellation) and asks the supervisor to stop, then re-raises so
  "Run All" stops too. `Job` itself neither prints nor decides what an
  interrupt means; `follow.steps()` is the one implementation of following a
  job, a generator that yields the seconds to sleep, and `follow()` (blocking)
  and `follow_async()` (awaiting, for the async cell) are two small drivers of
  it. When the kernel
  dies, the job goes on. The kernel reaps its supervisor child in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from ..contract.process import ProcessId
from ..contract.status import JobStatus
from ..timing import Deadline
from . import standby
from .job import Job, JobInterrupted, outcome
from .output import LogTail

POLL_SECONDS = 0.1

Steps = Generator[float, None, str]  # yields seconds to sleep; returns the final state


class View(Protocol):
    """What a follow ticks: a widget, a text summary, or anything with ``refresh``."""

    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None: ...


def _print(lines: list[str], out: TextIO) -> None:
    for line in lines:
        print(line, file=out, flush=True)


def refreshed(view: View, **options: Any) -> bool:
    """Refresh the view; on an error say so once (the caller drops the view)."""
    try:
        view.refresh(**options)
    except Exception as exc:
        _print([f"Warning: the job's view failed ({exc!r}); still following"], sys.stderr)
        return False
    return True


def steps(
    job: Job,
    view: View | None = None,
    timeout: float | None = None,
    stream: bool = True,
    out: TextIO | None = None,
    from_start: bool = True,
    all_output: bool = False,
    only: Collection[ProcessId] | None = None,
    until: Callable[[JobStatus], bool] | None = None,
    last: int = 0,
) -> Steps:
    """Watch ``job`` until it ends (or ``until`` says so of a running job's status: a
    session's cell has run); yields the seconds to wait between polls.

    Each poll reads the job's status once (before the logs, so no line written
    before the end is missed), prints the new log lines (``stream``), and passes
    the status to ``view.refresh``. Returns the final state; raises
    :class:`~jupyter_distrain.client.job.JobFailed` when the job failed and
    ``TimeoutError`` once ``timeout`` seconds have passed.
    """
    out = out or sys.stdout
    tail = LogTail(job.dir, from_start, all_output, only, last) if stream else None
    deadline = Deadline(timeout)
    warned = 0
    while True:
        status = job.status()
        # asked before the logs are read, as the status is: every line written before
        # the end (or before a rank's answer) is printed
        finished = status.done or (until is not None and until(status))
        _print([f"Warning: {w}" for w in status.warnings[warned:]], sys.stderr)
        warned = len(status.warnings)
        if tail is not None:
            _print(tail.read(), out)
        if view is not None and not refreshed(view, status=status):
            view = None  # a broken view must not end the wait: the job runs on
        if finished:
            break
        if deadline.expired:
            raise TimeoutError(f"job {job.id} still {status.state} after {timeout} s")
        yield POLL_SECONDS
    if tail is not None:
        _print(tail.flush(), out)
    return outcome(job.id, status) if status.done else status.state


class _Run:
    """Drives :func:`steps`, keeping the final state it returns."""

    def __init__(self, watch: Steps):
        self.watch = watch
        self.state = ""

    def delay(self) -> float | None:
        """Seconds to wait before the next poll; None once the job has ended."""
        try:
            return next(self.watch)
        except StopIteration as end:
            self.state = end.value
            return None


def _interrupted(job: Job, out: TextIO | None, stop: bool) -> str | None:
    """The interrupt policy: stop the job (saying so) unless told not to; its state then."""
    if not stop:
        return None
    out = out or sys.stdout
    print(f"Interrupted: stopping job {job.id} ...", file=out, flush=True)
    state = job.stop()
    print(f"Job {job.id} {state}.", file=out, flush=True)
    return state


@contextlib.contextmanager
def _watching(job: Job, view: View | None, out: TextIO | None, stop: bool) -> Iterator[None]:
    """What both drivers do around the polls: Ctrl-C's policy, and the view's last refresh."""
    try:
        yield
    except KeyboardInterrupt:
        _interrupted(job, out, stop)
        raise
    finally:
        if view is not None:
            refreshed(view, force=True)
        with contextlib.suppress(OSError, ValueError):  # the next job's supervisor: back to
            standby.prepare(job.spec.launcher)  # normal, or started (see client/standby.py)


@dataclass(frozen=True)
class FollowOptions:
    """How to follow a job: ``timeout`` (seconds, None for ever), ``stream`` the
    processes' output to ``out`` (default stdout), ``from_start`` of the logs or from
    now, whether an interrupt stops the job (``stop_on_interrupt``), and whether to
    show the output exactly as written (``all_output``; by default progress bars show
    their last state and TensorFlow's start-up lines show once); ``only`` these
    processes' output (default: every process's); ``last``: from now, after each log's
    last lines."""

    timeout: float | None = None
    stream: bool = True
    out: TextIO | None = None
    from_start: bool = True
    stop_on_interrupt: bool = True
    all_output: bool = False
    only: Collection[ProcessId] | None = None
    until: Callable[[JobStatus], bool] | None = None
    last: int = 0  # not from_start: each log's last lines first

    def run(self, job: Job, view: View | None) -> _Run:
        return _Run(
            steps(
                job,
                view,
                self.timeout,
                self.stream,
                self.out,
                self.from_start,
                self.all_output,
                self.only,
                self.until,
                self.last,
            )
        )


def follow(job: Job, view: View | None = None, **options: Any) -> str:
    """Wait for the job to end (blocking), printing every process's output with its label.

    ``options`` are :class:`FollowOptions`' fields. ``view`` is refreshed on every
    poll and once more (forced) at the end. Interrupting the wait (Ctrl-C) stops the
    job, unless ``stop_on_interrupt`` is false, and re-raises. Returns the final
    state; raises ``JobFailed`` when it failed.
    """
    opts = FollowOptions(**options)
    run = opts.run(job, view)
    with _watching(job, view, opts.out, opts.stop_on_interrupt):
        while (delay := run.delay()) is not None:
            time.sleep(delay)
    return run.state


async def follow_async(job: Job, view: View | None = None, **options: Any) -> str:
    """:func:`follow` for an event loop: the loop is free between polls, so a kernel
    handles widget events (the Stop button) while a cell waits.

    A kernel interrupts an async cell by cancelling it: the job is stopped and
    :class:`~jupyter_distrain.client.job.JobInterrupted` raised (one line in the cell, and
    "Run All" stops here); with ``stop_on_interrupt`` false the cancellation goes on.
    """
    opts = FollowOptions(**options)
    run = opts.run(job, view)
    with _watching(job, view, opts.out, opts.stop_on_interrupt):
        try:
            while (delay := run.delay()) is not None:
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            state = _interrupted(job, opts.out, opts.stop_on_interrupt)
            if state is None:
                raise
            raise JobInterrupted(job.id, state) from None
    return run.state
