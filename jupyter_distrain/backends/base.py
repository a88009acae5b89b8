"""The backend interface.

A backend never starts a process: given the slots a launcher placed and the
command that runs the worker bootstrap, it returns the processes to start
(role, index, argv, env) and runs whatever the job needs beside them in the
supervisor (Horovod's rendezvous server, for instance).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..launchers.base import LaunchedProcess, Launcher, ProcessSpec, Slot
    from ..spec import JobSpec
    from ..store import JobDir, ProcessRecord


@dataclass
class Outcome:
    """How a job ends. On success the processes still alive are stopped after the grace."""

    state: str  # "succeeded" or "failed"
    error: str | None = None
    culprit: ProcessRecord | None = None


def first_failure(records: Sequence[ProcessRecord]) -> ProcessRecord | None:
    """The earliest process to exit with a non-zero code."""
    failed = [r for r in records if r.exit_code not in (None, 0) and not r.hosts_ranks]
    return min(failed, key=lambda r: r.ended or 0) if failed else None


def all_must_succeed(records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
    """The rule for SPMD jobs: any non-zero exit fails the job; all exiting 0 succeeds it."""
    if ended.exit_code:
        culprit = first_failure(records) or ended
        return Outcome(
            "failed", f"{culprit.describe()} failed first (exit code {culprit.exit_code})", culprit
        )
    if all(r.state == "exited" and r.exit_code == 0 for r in records):
        return Outcome("succeeded")
    return None


class Backend(ABC):
    name: ClassVar[str]

    def __init__(self, spec: JobSpec, job: JobDir):
        self.spec = spec
        self.job = job

    def bind(
        self,
        start_process: Callable[[ProcessSpec], LaunchedProcess],
        post: Callable[[str, dict[str, Any]], None],
    ) -> None:
        """The supervisor's callbacks, for backends whose own driver decides when processes
        start (elastic Horovod) or reports the job's end (``post("backend_done", ...)``)."""
        self.start_process = start_process
        self.post = post

    def start(self, worker_argv: list[str], worker_env: dict[str, str]) -> None:  # noqa: B027
        """Called once the planned processes are started."""

    def scale_in_place(self, workers: int) -> bool:
        """Resize without a restart, if this backend can; the default cannot."""
        return False

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can run here, and why (or why not)."""
        return True, f"{cls.name} is available"

    def slots_needed(self) -> int:
        """How many slots the launcher must place."""
        return self.spec.workers

    def start_services(self, slots: list[Slot], launcher: Launcher) -> None:  # noqa: B027
        """Start driver-side services before any process is launched."""

    def stop_services(self) -> None:  # noqa: B027
        """Stop what :meth:`start_services` started."""

    @abstractmethod
    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        """The processes to launch. ``worker_argv`` with ``worker_env`` runs the worker
        bootstrap; every process of the plan must carry ``worker_env``."""

    def info(self) -> dict[str, object]:
        """Facts about the job for state.json (e.g. the TF cluster)."""
        return {}

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        """Called after each process ends: the job's outcome, or None while it goes on."""
        return all_must_succeed(records, ended)
