"""What state.json says: the job's state and one row per process (the schema the
supervisor writes and every view reads).

Job states: pending -> launching -> running -> succeeded | failed | stopped (and
"unknown" for a state.json that cannot be read). A process row: pending -> starting ->
running -> exited | killed, or "lost" when the process was running as its supervisor
was lost (it stays "lost" until someone stops it, then "killed").

Job and process states
----------------------

Job: `pending -> launching -> running -> succeeded | failed | stopped`.
Process: `pending -> starting -> running -> exited | killed` (killed = ended
by a signal). `state.json` is rewritten atomically on each change; if the
supervisor vanishes without writing a final state, `Job.status()` reports
`failed` ("the supervisor died"). `Job.status()` returns the typed
`status.JobStatus`: `processes` (members: workers, chief, ps; the rows views
draw) and `helpers` (mpirun), each a `ProcessRecord`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .process import ProcessId

# what a native crash's signal means, in words a user reads
_CRASHES = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGBUS: "a bus error",
    signal.SIGFPE: "an arithmetic error",
    signal.SIGILL: "an illegal instruction",
    signal.SIGABRT: "aborted",
}


def exit_text(code: int | None) -> str:
    """How a process ended, in words: ``"exit code 3"``, ``"killed by SIGKILL"``,
    ``"killed by SIGSEGV, a segmentation fault"`` (a negative code is the signal)."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"killed by signal {-code}"
    crash = _CRASHES.get(sig)
    return f"killed by {sig.name}" + (f", {crash}" if crash else "")


FINAL_STATES = frozenset({"succeeded", "failed", "stopped"})
LIVE_PROCESS_STATES = frozenset({"pending", "starting", "running"})


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class ProcessRecord:
    """What state.json says about one process (a row of the job's table)."""

    role: str
    index: int
    host: str
    rank: int | None = None  # the rank it trains as, where it has one
    pid: int | None = None
    address: str = ""  # where other processes reach it (the host's IP address)
    state: str = "pending"  # pending -> starting -> running -> exited | killed | lost
    exit_code: int | None = None
    started: float | None = None
    ended: float | None = None
    log: str = ""
    create_time: float | None = None  # the OS's start time of ``pid``: with it, a pid is exact
    gpus: list[str] = field(default_factory=list)  # CUDA devices given (CUDA_VISIBLE_DEVICES)
    pooled: bool = False  # a warm process from the pool, not started cold
    gpu_percent: float | None = None  # utilisation of its GPUs (NVML), when it has some
    gpu_memory: int | None = None  # bytes used on its GPUs
    stopped: bool = False  # ended on request (stop_workers), not by failing
    generation: int = 0  # how many times the job was restarted (scaled) before this process
    hosts: list[str] = field(default_factory=list)  # a helper (mpirun): the processes it starts
    # the live view, from the metrics channel
    step: int | None = None
    images_per_sec: float | None = None
    loss: float | None = None
    total_steps: int | None = None
    heartbeat: float | None = None  # time of the last record or heartbeat
    memory: int | None = None  # resident bytes, its children's included, at the last sample
    oom_killed: bool = False  # ended by the system's OOM killer

    @property
    def id(self) -> ProcessId:
        return ProcessId(self.role, self.index)

    @property
    def live(self) -> bool:
        return self.state in LIVE_PROCESS_STATES

    def describe(self) -> str:
        return self.id.describe()

    def ended_text(self) -> str:
        """How it ended, in words: :func:`exit_text`, or the OOM killer and the memory the
        process held at its last sample."""
        if self.oom_killed:
            held = (
                f", holding {self.memory / 2**30:.2f} GiB at its last sample" if self.memory else ""
            )
            return f"killed by the OOM killer: out of memory{held}"
        return exit_text(self.exit_code)

    def where(self) -> str:
        """ " on host NAME" for a process on another host (reached on a network address),
        else "": what a message adds to name the host when a job spans hosts."""
        try:
            remote = bool(self.address) and not ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            remote = True  # a host name
        return f" on host {self.host}" if remote else ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(**_known_fields(cls, data))


@dataclass
class JobStatus:
    """state.json: the job's state and every process's row, as the supervisor last wrote it.

    ``processes`` are the job's members (they run the worker bootstrap: one row per
    worker, ps, chief); ``helpers`` are processes that only start members (mpirun).
    """

    state: str = "pending"
    backend: str = ""
    launcher: str = ""
    workers: int = 0
    generation: int = 0
    restarts: int = 0  # after failures (--max-restarts)
    scaling_to: int | None = None
    supervisor_pid: int | None = None
    created: float | None = None
    running_at: float | None = None
    ended: float | None = None
    error: str | None = None
    error_tail: str = ""
    processes: list[ProcessRecord] = field(default_factory=list)
    helpers: list[ProcessRecord] = field(default_factory=list)
    metrics_records: int = 0
    metrics_rejected: int = 0
    warnings: list[str] = field(default_factory=list)  # said once in the cell
    backend_info: dict[str, Any] = field(default_factory=dict)  # e.g. the TF cluster

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def process(self, pid: ProcessId) -> ProcessRecord | None:
        return next((p for p in self.processes if p.id == pid), None)

    def lost(self, error: str, row_state: str = "lost") -> JobStatus:
        """This status as it must read once the supervisor is gone without an end: failed
        with ``error``, every row still live marked ``row_state``."""
        rows = [
            dataclasses.replace(p, state=row_state) if p.live else p
            for p in [*self.processes, *self.helpers]
        ]
        n = len(self.processes)
        return dataclasses.replace(
            self, state="failed", error=error, processes=rows[:n], helpers=rows[n:]
        )

    def pids(self) -> list[int]:
        """Every process id recorded: members and helpers (not the supervisor)."""
        return [p.pid for p in [*self.processes, *self.helpers] if p.pid]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobStatus:
        status = cls(**_known_fields(cls, data))
        status.processes = [ProcessRecord.from_dict(p) for p in data.get("processes", [])]
        status.helpers = [ProcessRecord.from_dict(p) for p in data.get("helpers", [])]
        return status


def aggregate_images_per_sec(processes: Iterable[ProcessRecord]) -> float:
    """The job's images/sec: the sum over its live processes."""
    return sum(p.images_per_sec or 0.0 for p in processes if p.live and p.images_per_sec)
