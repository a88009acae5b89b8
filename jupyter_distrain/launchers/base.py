"""The launcher interface: place slots on hosts, start and signal processes.

A launcher knows nothing about TensorFlow or Horovod: it gets a
:class:`ProcessSpec` (argv + env) from a backend and runs it with the job's
cpu/memory limits, its output going to a log file.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import psutil

if TYPE_CHECKING:
    from ..spec import JobSpec
    from ..store import JobDir


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

    role: str  # "worker", "mpirun", ...
    index: int  # index within the role
    argv: list[str]
    env: dict[str, str]
    slot: Slot | None = None
    ranks: list[int] = field(default_factory=list)  # the ranks this process runs
    hosts_ranks: bool = False  # True for mpirun: its ranks get rows of their own

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}"


class LaunchedProcess(ABC):
    """A started process, owned by the launcher that started it."""

    pid: int

    @abstractmethod
    def wait(self) -> int:
        """Block until the process exits; return its exit code (negative: signal)."""

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code if the process has exited, else None."""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process, its process group and every descendant."""
        signal_tree(self.pid, sig)

    def memory_bytes(self) -> int:
        """Resident memory of the process and all its descendants."""
        return tree_rss(self.pid)


class Launcher(ABC):
    """Places slots and starts processes. Subclasses register an entry point."""

    name: ClassVar[str]

    def __init__(self, spec: JobSpec, job: JobDir):
        self.spec = spec
        self.job = job

    @abstractmethod
    def place(self, n: int) -> list[Slot]:
        """Choose where ``n`` workers run."""

    def driver_address(self) -> str:
        """The address workers reach the supervisor's services on."""
        return "127.0.0.1"

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        """A free TCP port on each slot's host (all distinct), for servers the job runs."""
        sockets = []
        try:
            for slot in slots:
                sock = socket.socket()
                sock.bind((slot.address, 0))
                sockets.append(sock)
            return [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()

    @abstractmethod
    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        """Start one process with its output appended to ``log_path``."""

    def close(self) -> None:
        """Release whatever the launcher holds (cgroups, connections)."""


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def signal_tree(pid: int, sig: int) -> None:
    """Signal a process, its whole process group, and descendants that left the group."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
