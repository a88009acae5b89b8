"""The backend interface.

A backend never starts a process: given the slots a launcher placed and the
command that runs the worker bootstrap, it returns the processes to start
(role, index, argv, env) and runs whatever the job needs beside them in the
supervisor (Horovod's rendezvous server, for instance).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..launchers.base import ProcessSpec, Slot
    from ..spec import JobSpec
    from ..store import JobDir


class Backend(ABC):
    name: ClassVar[str]

    def __init__(self, spec: JobSpec, job: JobDir):
        self.spec = spec
        self.job = job

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can run here, and why (or why not)."""
        return True, f"{cls.name} is available"

    def start_services(self, slots: list[Slot], driver_address: str) -> None:  # noqa: B027
        """Start driver-side services before any process is launched."""

    def stop_services(self) -> None:  # noqa: B027
        """Stop what :meth:`start_services` started."""

    @abstractmethod
    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        """The processes to launch. ``worker_argv`` with ``worker_env`` runs the worker
        bootstrap; every process of the plan must carry ``worker_env``."""
