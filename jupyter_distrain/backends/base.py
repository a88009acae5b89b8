"""The backend interface: a backend turns placed slots into a :class:`Plan`.

A backend never starts a process. :meth:`Backend.prepare` gets the slots a
launcher placed and the command that runs the worker bootstrap, starts what
the job needs beside its processes (Horovod's rendezvous server, say) and
returns it all as one plan: the processes to start, the services to stop at
the end, and facts for state.json. :meth:`Backend.outcome` says how the job
ends after each exit. That is the whole interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..contract.keys import ProcessKeys
from ..contract.launch import GPUS, MPIRUN
from ..contract.process import ProcessId

if TYPE_CHECKING:
    from ..contract.launch import LaunchedProcess, Network, ProcessSpec, Slot
    from ..contract.spec import JobSpec
    from ..contract.status import ProcessRecord


@dataclass(frozen=True)
class WorkerCommand:
    """How to run the worker bootstrap; every process of a plan carries ``env``, and
    its own key from ``keys`` (the supervisor's: ``contract/keys.py``)."""

    argv: list[str]
    env: dict[str, str]
    keys: ProcessKeys = field(default_factory=ProcessKeys)

    def process(
        self,
        pid: ProcessId,
        slot: Slot | None,
        rank: int | None = None,
        **extra_env: str,
    ) -> ProcessSpec:
        from ..contract.launch import ProcessSpec

        return ProcessSpec(pid, list(self.argv), {**self.env, **extra_env}, slot, rank)


class JobHost(Protocol):
    """What the supervisor offers services whose own driver starts processes (elastic
    Horovod). Both may be called from any thread."""

    def start_process(self, proc: ProcessSpec) -> LaunchedProcess:
        """Start and record one process; returns once it is started."""
        ...

    def backend_done(self, error: str | None) -> None:
        """The driver says the job has ended (with ``error``, failed)."""
        ...


class Services:
    """What a plan runs in the supervisor beside its processes; by default nothing."""

    def start(self, host: JobHost) -> None:
        """Called once the plan's processes are started."""

    def resize(self, workers: int) -> bool:
        """Resize the job in place, if these services can; by default they cannot."""
        return False

    def stop(self) -> None:
        """Stop everything :meth:`Backend.prepare` started (called once, from the loop)."""


@dataclass
class Plan:
    """What :meth:`Backend.prepare` returns."""

    processes: list[ProcessSpec]
    services: Services = field(default_factory=Services)
    info: dict[str, object] = field(default_factory=dict)  # for state.json (the TF cluster)
    ports: dict[str, list[int]] = field(default_factory=dict)  # what listens, for warnings


@dataclass
class Outcome:
    """How a job ends. On success the processes still alive are stopped after the grace."""

    state: str  # "succeeded" or "failed"
    error: str | None = None
    culprit: ProcessRecord | None = None


def first_failure(records: Sequence[ProcessRecord]) -> ProcessRecord | None:
    """The earliest process to exit with a non-zero code."""
    failed = [r for r in records if r.exit_code not in (None, 0)]
    return min(failed, key=lambda r: r.ended or 0) if failed else None


def failed_first(records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome:
    culprit = first_failure(records) or ended
    what = f"{culprit.describe()}{culprit.where()} failed first ({culprit.ended_text()})"
    return Outcome("failed", what, culprit)


def all_must_succeed(records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
    """The rule for SPMD jobs: any non-zero exit fails the job; all exiting 0 succeeds it."""
    if ended.exit_code:
        return failed_first(records, ended)
    if all(r.state == "exited" and r.exit_code == 0 for r in records):
        return Outcome("succeeded")
    return None


class Backend(ABC):
    """Subclasses register an entry point in ``jupyter_distrain.backends``."""

    name: ClassVar[str]

    def __init__(self, spec: JobSpec):
        self.spec = spec

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can run here, and why (or why not)."""
        return True, f"{cls.name} is available"

    @classmethod
    def framework_version(cls) -> str | None:
        """The version of the framework this backend runs, where every host must have the
        same one (the ssh pre-flight compares them); None: nothing to compare."""
        return None

    def slots_needed(self) -> int:
        """How many slots the launcher must place."""
        return self.spec.workers

    def needs(self) -> dict[str, str]:
        """What this job needs of its launcher beyond starting processes (capabilities of
        :mod:`..contract.launch`), each with the words that asked for it, as a refusal
        names them (``--controller mpi is not supported by ...``)."""
        needed = {}
        if self.spec.uses_mpirun():
            needed[MPIRUN] = "--backend mpi" if self.spec.backend == "mpi" else "--controller mpi"
        if self.spec.gpus:
            needed[GPUS] = "--gpus"
        return needed

    def needs_isolation(self, on_other_hosts: bool) -> str | None:
        """Why this job must not run where others can reach its servers (one of them runs
        what a caller sends it) and what to do instead, or None. The supervisor refuses
        such a job where it could not isolate it. ``on_other_hosts``: the user asked for
        other hosts (ssh, Slurm, a Ray cluster), whose network then reaches the servers
        as the cell's warning says."""
        return None

    @abstractmethod
    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        """Start the job's services for these slots and say which processes to start."""

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        """Called after each member ends: the job's outcome, or None while it goes on."""
        return all_must_succeed(records, ended)
