"""What a backend and a launcher agree on: the slots a job is placed on, the processes a
backend plans for them, the handle of a process a launcher started, and the two things
a backend may ask of the launcher that places it (:class:`Network`).

A launcher knows nothing about TensorFlow or Horovod: it gets a :class:`ProcessSpec`
(argv + env) from a backend and runs it. Every signal, memory reading and liveness
check the supervisor makes goes through a :class:`LaunchedProcess` that a launcher
returned, so a remote launcher implements them once and the supervisor never touches
a pid itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from .process import ProcessId

# What a job may need of the launcher that places it beyond starting processes: a backend
# says which of these its spec needs (``Backend.needs``), a launcher which it gives
# (``LauncherKind.supports``); ``plugins.check_support`` meets the two once, at submit.
MPIRUN = "mpirun"  # one mpirun starts every rank (--backend mpi, --controller mpi)
GPUS = "gpus"  # --gpus: devices assigned to each rank
ELASTIC = "elastic"  # Horovod elastic's driver and rendezvous server, fed new hosts
CAPABILITIES = frozenset({MPIRUN, GPUS, ELASTIC})


@dataclass(frozen=True)
class Slot:
    """One place a worker can run."""

    host: str  # the name the backend uses for this host (Horovod's plan hostname)
    address: str  # an address other processes can reach it on
    index: int  # global slot index
    local_index: int  # index among the slots of the same host
    iface: str = "lo"  # the network interface to use for collectives


@dataclass
class ProcessSpec:
    """One process to start, as computed by a backend."""

    id: ProcessId
    argv: list[str]
    env: dict[str, str]
    slot: Slot | None = None
    rank: int | None = None  # the rank it trains as, where it has one
    # A helper that starts other members itself (mpirun): those members and their slots.
    # They have rows of their own and report their own pids and exits.
    hosts: dict[ProcessId, Slot] = field(default_factory=dict)


class LaunchedProcess(ABC):
    """A process that a launcher started (or adopted), owned by that launcher."""

    pid: int
    host: str = "localhost"
    create_time: float | None = None  # the OS's start time: (pid, create_time) is exact
    gpus: list[str] = []  # the GPU devices it was given (set per process by start)
    pooled: bool = False  # taken from a warm pool rather than started
    own_job_dir: bool = False  # it runs in a copy of the job directory (another host's)

    @abstractmethod
    def wait(self) -> int:
        """Block until the process exits; return its exit code (negative: signal)."""

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code if the process has exited, else None."""

    @abstractmethod
    def signal(self, sig: int, tree: bool = False) -> None:
        """Send ``sig`` to the process; with ``tree``, to everything it started too."""

    @abstractmethod
    def memory_bytes(self) -> int:
        """Resident memory of the process and all its descendants."""

    def gpu_usage(self) -> GpuUsage | None:
        """Utilisation and memory of the GPUs it was given; None without GPUs or NVML."""
        return None

    def receive_files(self, files: dict[str, bytes]) -> None:
        """Write ``files`` (by their path in the job directory) into the job directory
        where the process runs (a session's cells), where that is not the supervisor's
        own (:attr:`own_job_dir`)."""
        raise NotImplementedError(f"{type(self).__name__} shares the supervisor's directory")

    def native_stack(self) -> str:
        """Its threads' native and Python frames now (``py-spy dump --native``), or one
        line saying why they cannot be had (blocks for up to seconds)."""
        return "native frames: only for processes on this machine"

    def oom_killed(self) -> bool:
        """Whether the system's OOM killer ended it (asked once it has exited); False
        where the launcher cannot tell."""
        return False

    def host_lost(self) -> bool:
        """Whether it ended with its host (or node) out of reach: no exit code came back
        (asked once it has ended); False where the launcher cannot tell."""
        return False

    @property
    def alive(self) -> bool:
        return self.poll() is None


@dataclass(frozen=True)
class GpuUsage:
    """What a process's devices are doing: mean utilisation and memory used."""

    percent: float
    memory_bytes: int


class Network(Protocol):
    """What a backend may ask of the launcher placing its job (the launcher is one)."""

    def driver_address(self) -> str:
        """The address workers reach the supervisor's services on."""
        ...

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        """A free TCP port on each slot's host (all distinct), for servers the job runs."""
        ...
