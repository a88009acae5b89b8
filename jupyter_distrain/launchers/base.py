"""The launcher interface: place slots on hosts; start, signal, measure and reap processes.

A launcher is two classes: its :class:`LauncherKind`, what it is and checks at submit
time in the notebook (options, capabilities, capacity, isolation, what it keeps), and
its :class:`Launcher`, what it does at run time in the supervisor (place, start, adopt,
sweep, close). It knows nothing about TensorFlow or Horovod: it gets a
:class:`ProcessSpec` (argv + env) from a backend and runs it with the job's cpu/memory
limits, its output going to a log file. Every signal, memory reading and liveness
check the supervisor makes goes through a :class:`LaunchedProcess` that a launcher
returned, so a remote launcher implements them once.
"""

from __future__ import annotations

import re
import secrets
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..contract.launch import CAPABILITIES, LaunchedProcess, ProcessSpec, Slot
from ..contract.spec import SpecError

if TYPE_CHECKING:
    from ..contract.spec import JobSpec
    from ..contract.status import JobStatus
    from ..contract.store import JobDir


class LaunchCancelled(RuntimeError):
    """The job was asked to stop while its launcher waited to place it (a queue)."""


_TYPE_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


@dataclass(frozen=True)
class LauncherOption:
    """One option a launcher takes: a key of ``JobSpec.launcher_options`` and the
    ``%%distributed`` (and ``bench``) flag that sets it, built from this by the flag table
    (:mod:`jupyter_distrain.client.flags`)."""

    name: str  # the key in JobSpec.launcher_options (and the old JobSpec keyword), e.g. ssh_port
    type: type  # str, int, float or bool (a switch)
    default: Any
    help: str
    flag: str = ""  # default: --NAME with dashes (--ssh-port)
    metavar: str | None = None
    # raises SpecError naming the flag when a value is bad (the type is checked after it)
    check: Callable[[str, Any], None] | None = None
    # giving it with another launcher is refused: "{flag} is for {only_for}: add --launcher X"
    only_for: str = ""

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def validate(self, value: Any) -> None:
        """Raise :class:`SpecError` (one line naming the flag) when ``value`` is bad."""
        if self.check is not None:
            self.check(self.flag_name, value)
        numeric = self.type in (int, float) and not isinstance(value, bool)
        if not (isinstance(value, self.type) or numeric and isinstance(value, int)):
            raise SpecError(f"{self.flag_name} must be {_TYPE_WORDS[self.type]}, got {value!r}")


def in_range(low: int, high: int, what: str) -> Callable[[str, Any], None]:
    """An option check: a whole number ``low``..``high`` (``what`` names it)."""

    def check(flag: str, value: Any) -> None:
        if not isinstance(value, int) or not low <= value <= high:
            raise SpecError(f"{flag} must be {what}, got {value!r}")

    return check


def matching(pattern: str, what: str) -> Callable[[str, Any], None]:
    """An option check: empty, or text matching ``pattern`` whole (``what`` names it)."""
    compiled = re.compile(pattern, re.IGNORECASE)

    def check(flag: str, value: Any) -> None:
        if value and not (isinstance(value, str) and compiled.fullmatch(value)):
            raise SpecError(f"{flag}: {value!r} is not {what}")

    return check


class LauncherKind:
    """The submit-time part of a launcher, never instantiated: its name, the options a
    spec may set and what it gives a backend (declared), the checks and look-ups made in
    the notebook before a job exists (capacity, pool, notes, isolation, who reaches its
    servers, the pools and connections it keeps), and the clean-up of what a lost
    supervisor held. What it says of a spec holds for the job's whole life."""

    name: ClassVar[str]
    # what the job's spec may set for this launcher (JobSpec.launcher_options), and the
    # flags that set them: adding one here adds its flag to %%distributed and bench
    declared_options: ClassVar[tuple[LauncherOption, ...]] = ()
    # what it gives of what a backend may need (contract.launch's capabilities), and why
    # not, where more than " yet" is to say: plugins.check_support refuses the rest
    supports: ClassVar[frozenset[str]] = CAPABILITIES
    why_not: ClassVar[dict[str, str]] = {}

    @classmethod
    def option_values(cls, spec: JobSpec) -> dict[str, Any]:
        """This launcher's options for ``spec``: each one given, else its default."""
        return {o.name: spec.launcher_options.get(o.name, o.default) for o in cls.declared_options}

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        """Raise ``SpecError`` (one line naming the flag) when this launcher cannot place
        ``processes`` processes of ``spec``; called before anything is launched. Returns
        the spec with what the launcher chose for it (the GPUs to use)."""
        return spec

    @classmethod
    def choose_pool(cls, spec: JobSpec, environ: dict[str, str]) -> JobSpec:
        """The spec with the warm pool its processes may come from (``pool_socket``),
        where this launcher keeps pools; called at submit, after ``check_capacity``."""
        return spec

    @classmethod
    def notes(cls, spec: JobSpec) -> list[str]:
        """Lines the cell prints once at submit about what this launcher chose."""
        return []

    @classmethod
    def preload(cls) -> None:
        """Import ahead what this launcher's supervisor imports on its way to the first
        step, in a supervisor on standby (``supervisor/standby.py``) after a job of this
        launcher. Must start no thread (the supervisor forks). Nothing by default."""

    @classmethod
    def isolate(cls) -> str | None:
        """Called first in the supervisor process, before any socket or thread exists:
        keep what the job starts unreachable from elsewhere where this launcher can.
        Returns None when isolated, else a warning naming why not."""
        return "this launcher does not isolate its processes"

    @classmethod
    def reachable_by(cls, spec: JobSpec) -> str:
        """Who reaches what the job's processes listen on when it is not isolated (the
        warning that lists those ports names them)."""
        return "other hosts"

    @classmethod
    def remote_pools(cls, drain: bool = False) -> dict[str, Any]:
        """The warm pools this launcher's jobs started beyond this machine, by where they
        are: a list of :class:`~..pool.client.PoolInfo`, or why that place could not be
        asked (``drain``: after asking them to end their idle processes). None here."""
        return {}

    @classmethod
    def kept_connections(cls) -> list[str]:
        """A line for each connection this launcher keeps between jobs (none here)."""
        return []

    @classmethod
    def retire_kept(cls) -> list[str]:
        """Let those connections go (one a running job uses, once that job ends); the
        places they went to."""
        return []

    @classmethod
    def runs_on_other_hosts(cls, spec: JobSpec) -> bool:
        """Whether the user asked for other hosts for this job: a server of it that runs
        what a caller sends is then exposed to their network (and said), not refused."""
        return False

    @classmethod
    def isolate_job(cls, spec: JobSpec) -> str | None:
        """:meth:`isolate` for this job, where that depends on the job (the supervisor
        calls this one); the default is :meth:`isolate`."""
        return cls.isolate()

    @classmethod
    def channel_host(cls, spec: JobSpec) -> str | None:
        """The address the job's processes reach the supervisor's control and metrics
        channels on, which then listen on TCP there only (signed with the job's secret);
        None: Unix sockets in the job directory (every process runs on this machine,
        or the launcher carries the sockets to its hosts itself)."""
        return None

    @classmethod
    def doctor(cls) -> list[str]:
        """What a job of this launcher would get here, a line each, each problem with
        its fix (``%distributed doctor``); nothing by default."""
        return []

    @classmethod
    def stop_lost(cls, status: JobStatus) -> list[int]:
        """Stop the processes a lost supervisor recorded (each verified by its start
        time, never by a bare pid); returns the pids stopped. By default: none."""
        return []

    @classmethod
    def release_lost(cls, job: JobDir) -> None:
        """Release what a lost supervisor of ``job`` held outside this machine (a
        cluster's allocation); its warden calls this once it has killed what was left
        here. By default: nothing."""


class Launcher(ABC):
    """The runtime part of a launcher, in the job's supervisor: places slots, starts
    and adopts processes, sweeps and reaps what they leave, closes what it holds, and
    passes on its progress and warnings. Subclasses register an entry point and name
    their :class:`LauncherKind` (:attr:`kind`)."""

    kind: ClassVar[type[LauncherKind]] = LauncherKind

    def __init__(self, spec: JobSpec, job: JobDir):
        self.spec = spec
        self.job = job
        # this generation of the job, as warm pools tell runs apart (pool/claims.py)
        self.run_id = f"{job.id}#{secrets.token_hex(4)}"
        self._progress: Callable[[str], bool] | None = None  # the supervisor's (on_progress)
        self._warnings: list[str] = []  # until the supervisor takes them (take_warnings)

    @abstractmethod
    def place(self, n: int) -> list[Slot]:
        """Choose where ``n`` processes run."""

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

    @abstractmethod
    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        """A handle on a process that one of ours started (an MPI rank), by its pid;
        None when it is already gone."""

    def sweep(self) -> None:  # noqa: B027
        """Kill whatever the job's processes left behind (grandchildren that escaped
        their process group, orphans), after the processes themselves are stopped."""

    def reap(self) -> None:  # noqa: B027
        """Collect exited orphans, so none stays a zombie (called periodically)."""

    def close(self) -> None:  # noqa: B027
        """Release whatever the launcher holds (cgroups, connections)."""

    def expect(self, workers: int) -> None:  # noqa: B027
        """The job restarts with ``workers`` workers (a scale): a launcher that keeps
        processes ready (a warm pool) prepares that many while this generation
        checkpoints."""

    def on_progress(self, reporter: Callable[[str], bool]) -> None:
        """Where :meth:`progress` lines go: the supervisor's (shown at once, the launch's
        ``--timeout`` counting from the last one; False once the job is asked to stop)."""
        self._progress = reporter

    def progress(self, text: str) -> bool:
        """A line about a launch that waits (a job pending in a cluster's queue), while
        :meth:`place` runs ("": no line, only the question); whether to go on waiting. A
        launcher told to stop gives up by raising :class:`LaunchCancelled`. Without a
        supervisor's hook: a warning."""
        if self._progress is None:
            if text:
                self.warn(text)
            return True
        return self._progress(text)

    def warn(self, text: str) -> None:
        """A warning line for the user (what a host sent back and was refused, say): the
        supervisor takes it (:meth:`take_warnings`) into the job's state, events and log."""
        self._warnings.append(text)

    def take_warnings(self) -> list[str]:
        """The warnings since the last call (thread-safe: a host's thread may warn)."""
        taken = []
        while self._warnings:  # each pop is atomic: one added meanwhile waits for the next call
            taken.append(self._warnings.pop(0))
        return taken
