"""What reaches the supervisor's loop: events posted by other threads, and requests
that want an answer (a future the loop completes)."""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.process import ProcessId

if TYPE_CHECKING:
    from ..contract.launch import LaunchedProcess, ProcessSpec


@dataclass
class Exited:
    """A process we launched has exited (from its wait thread)."""

    id: ProcessId
    handle: LaunchedProcess
    code: int


@dataclass
class Hello:
    """A worker says it is up (control channel)."""

    body: dict[str, Any]


@dataclass
class Bye:
    """A worker says it is about to exit (control channel)."""

    body: dict[str, Any]


@dataclass
class Metric:
    """The latest record of a batch from one process (metrics collector)."""

    record: dict[str, Any]
    received: float = field(default_factory=time.monotonic)  # when the collector had it


@dataclass
class StopRequested:
    reason: str


@dataclass
class StopProcesses:
    ids: list[ProcessId]


@dataclass
class ScaleRequested:
    workers: int


@dataclass
class StacksRequested:
    """Someone asked for every live process's stacks (``native``: with py-spy's native
    frames); ``future`` gets the report."""

    future: Future[dict[str, Any]]
    native: bool = False


@dataclass
class NativeStackRead:
    """py-spy's dump of one process, read for a stacks request (a thread of the loop's)."""

    id: ProcessId
    text: str


@dataclass
class StacksTaken:
    """A worker's stacks (control channel)."""

    body: dict[str, Any]


@dataclass
class StartProcess:
    """A backend's own driver (elastic Horovod) wants a process started."""

    proc: ProcessSpec


@dataclass
class BackendDone:
    """A backend's own driver says the job has ended."""

    error: str | None


@dataclass
class Request:
    """An event whose sender waits for the loop's answer."""

    event: Any
    future: Future[Any] = field(default_factory=Future)


class Inbox:
    """The loop's one door. ``post`` is safe from any thread and from signal handlers
    (``SimpleQueue.put`` is reentrant)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stop_posted = False  # a StopRequested was posted (a waiting launcher gives up)

    def post(self, event: Any) -> None:
        if isinstance(event, StopRequested):
            self.stop_posted = True  # a plain assignment: safe in a signal handler
        self._queue.put(event)

    def ask(self, event: Any, timeout: float) -> Any:
        """Post ``event`` and wait for the loop's answer (its exception is raised here)."""
        request = Request(event)
        self._queue.put(request)
        return request.future.result(timeout=timeout)

    def next(self, timeout: float) -> Any | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out
