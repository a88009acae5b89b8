"""The job directory: the single source of truth about a job, on disk.

Layout (mode 0700)::

    <root>/<job-id>/
      spec.json       the JobSpec as submitted
      train.py        the cell body, exactly
      push.pkl        variables pushed from the notebook (--push), if any
      state.json      job state + per-process state, rewritten atomically
      events.jsonl    append-only history
      logs/<role>-<index>.log
      checkpoints/
      control         the supervisor's endpoint + per-job secret (0600)
      result.pkl      what rank 0 bound to ``result`` (--out), if anything
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .process import Env, ProcessId
from .spec import JobSpec

JOB_STATES = ("pending", "launching", "running", "succeeded", "failed", "stopped")
FINAL_STATES = frozenset({"succeeded", "failed", "stopped"})
LIVE_PROCESS_STATES = frozenset({"pending", "starting", "running"})
# a row whose process was running when its supervisor was lost: "lost" until someone
# stops it, then "killed"
log = logging.getLogger(__name__)
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
RESERVE_BYTES = 256 * 1024


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
    state: str = "pending"  # pending -> starting -> running -> exited | killed
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

    @property
    def id(self) -> ProcessId:
        return ProcessId(self.role, self.index)

    @property
    def live(self) -> bool:
        return self.state in LIVE_PROCESS_STATES

    def describe(self) -> str:
        return self.id.describe()

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


class UnsafeJobDirectory(PermissionError):
    """A jobs root or job directory that others could have written: not trusted."""


JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


def aggregate_images_per_sec(processes: Iterable[ProcessRecord]) -> float:
    """The job's images/sec: the sum over its live processes."""
    return sum(p.images_per_sec or 0.0 for p in processes if p.live and p.images_per_sec)


def check_private(path: Path, what: str) -> None:
    """Refuse a directory that is a symlink, not ours, or writable by others (0700 for
    job directories: what is in them is run and unpickled)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise UnsafeJobDirectory(f"{what} {path} does not exist") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeJobDirectory(f"{what} {path} is not a directory (a symlink?): refusing it")
    if info.st_uid != os.getuid():
        raise UnsafeJobDirectory(
            f"{what} {path} belongs to uid {info.st_uid}, not to this user: refusing it"
        )
    if info.st_mode & 0o022:
        raise UnsafeJobDirectory(
            f"{what} {path} is writable by others (mode {info.st_mode & 0o777:o}): refusing it"
        )


def short_socket_path(preferred: Path, name: str) -> Path:
    """``preferred`` if it is short enough for a Unix socket, else ``name`` in a private
    per-user runtime directory."""
    if len(str(preferred)) <= MAX_SOCKET_PATH:
        return preferred
    return runtime_dir() / f"{name}.sock"


def runtime_dir() -> Path:
    """A private per-user directory with a short path, for sockets:
    ``$XDG_RUNTIME_DIR/jupyter-distrain-<uid>`` (under ``/tmp`` without it). Where that
    is not this user's own 0700 directory (in ``/tmp`` another user can make it first),
    a fresh private one of this process's, removed when the process exits."""
    global _fallback_runtime
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"jupyter-distrain-{os.getuid()}"
    with contextlib.suppress(OSError):
        runtime.mkdir(mode=0o700)
    if _is_private_dir(runtime):
        return runtime
    with _fallback_lock:
        if _fallback_runtime is None or not _is_private_dir(_fallback_runtime):
            made = Path(tempfile.mkdtemp(prefix=f"jd-{os.getuid()}-", dir="/tmp"))
            atexit.register(shutil.rmtree, made, ignore_errors=True)
            log.warning("%s is not a private directory of this user: using %s", runtime, made)
            _fallback_runtime = made
        return _fallback_runtime


_fallback_runtime: Path | None = None  # runtime_dir's, once the shared one was refused
_fallback_lock = threading.Lock()


def _is_private_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a link) of this user that only it can use."""
    try:
        info = path.lstat()
    except OSError:
        return False
    mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    return mine and stat.S_IMODE(info.st_mode) == 0o700


def jobs_root(create: bool = False) -> Path:
    """Where job directories live: ``$JUPYTER_DISTRAIN_ROOT`` or Jupyter's data dir.
    It must be this user's own directory, writable by nobody else."""
    env = os.environ.get(Env.ROOT)
    if env:
        root = Path(env)
    else:
        from jupyter_core.paths import jupyter_data_dir

        root = Path(jupyter_data_dir()) / "distrain" / "jobs"
    if create:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.exists() or root.is_symlink():
        check_private(root, "the jobs root")
    return root


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class JobDir:
    """Typed access to one job directory."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.disk_full: str | None = None  # set when a write found the disk full
        self.tolerate_full_disk = False  # the supervisor's: drop writes rather than crash

    @property
    def id(self) -> str:
        return self.path.name

    # --- files -----------------------------------------------------------
    spec_file = property(lambda self: self.path / "spec.json")
    train_file = property(lambda self: self.path / "train.py")
    push_file = property(lambda self: self.path / "push.pkl")
    result_file = property(lambda self: self.path / "result.pkl")
    state_file = property(lambda self: self.path / "state.json")
    events_file = property(lambda self: self.path / "events.jsonl")
    control_file = property(lambda self: self.path / "control")
    lock_file = property(lambda self: self.path / "lock")
    reserve_file = property(lambda self: self.path / ".reserve")
    logs_dir = property(lambda self: self.path / "logs")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    supervisor_log = property(lambda self: self.path / "logs" / "supervisor.log")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")

    def log_file(self, process: ProcessId) -> Path:
        return self.logs_dir / f"{process}.log"

    def log_files(self) -> dict[ProcessId, Path]:
        """Every process log there is, by process (the supervisor's own log excluded)."""
        found = {}
        for path in sorted(self.logs_dir.glob("*-*.log")):
            try:
                found[ProcessId.parse(path.stem)] = path
            except ValueError:
                continue
        return found

    def keras_backup_dir(self, rank: int = 0) -> Path:
        """Where Keras's BackupAndRestore keeps rank ``rank``'s backup (rank 0's is the truth)."""
        name = "keras-backup" if rank == 0 else f"keras-backup-rank{rank}"
        return self.checkpoints_dir / name

    # --- creation --------------------------------------------------------
    @classmethod
    def create(cls, spec: JobSpec, root: Path | None = None) -> JobDir:
        """Make a new, private job directory holding the spec and ``train.py``."""
        root = root or jobs_root(create=True)
        while True:
            job_id = f"{spec.name}-{secrets.token_hex(3)}"
            try:
                (root / job_id).mkdir(mode=0o700)
                break
            except FileExistsError:
                continue
        job = cls(root / job_id)
        os.chmod(job.path, 0o700, follow_symlinks=False)  # mkdir's mode is masked by the umask
        job.logs_dir.mkdir(mode=0o700)
        job.checkpoints_dir.mkdir(mode=0o700)
        job.write_spec(spec)
        write_atomic(job.train_file, spec.code)
        job.write_state(JobStatus(created=time.time()))
        return job

    def check_private(self) -> JobDir:
        """Raise :class:`UnsafeJobDirectory` unless the directory is this user's, 0700."""
        check_private(self.path, "the job directory")
        if self.path.stat().st_mode & 0o077:
            raise UnsafeJobDirectory(f"the job directory {self.path} is not private (0700)")
        return self

    # --- spec / state ----------------------------------------------------
    def read_spec(self) -> JobSpec:
        return JobSpec.from_dict(json.loads(self.spec_file.read_text()))

    def write_spec(self, spec: JobSpec) -> None:
        write_atomic(self.spec_file, json.dumps(spec.to_dict(), indent=2))

    def read_state(self) -> JobStatus:
        """state.json; a missing one is ``pending``, an unreadable one ``unknown`` (with
        the reason as its error), so one bad file never breaks a listing."""
        try:
            return JobStatus.from_dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return JobStatus()
        except (ValueError, TypeError, AttributeError, RecursionError, OSError) as exc:
            return JobStatus(state="unknown", error=f"state.json is unreadable: {exc}")

    def write_state(self, status: JobStatus) -> None:
        text = json.dumps(status.to_dict(), indent=2)
        self._write(lambda: write_atomic(self.state_file, text))

    # --- what travels between the notebook and the workers --------------------
    def write_pushed(self, data: bytes) -> None:
        write_atomic(self.push_file, data)

    def write_result(self, data: bytes) -> None:
        write_atomic(self.result_file, data)

    def read_result(self) -> dict[str, Any] | None:
        """What rank 0 stored (``{"defined": bool, "value": ...}``), or None."""
        import pickle

        try:
            with open(self.result_file, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None

    def read_pushed(self) -> dict[str, Any]:
        """The notebook variables sent with ``--push`` (none when nothing was pushed)."""
        import pickle

        try:
            with open(self.push_file, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return {}

    # --- events ----------------------------------------------------------
    def append_event(self, kind: str, **fields: Any) -> None:
        record = {"time": time.time(), "event": kind, **fields}

        def write() -> None:
            with open(self.events_file, "a") as f:
                f.write(json.dumps(record) + "\n")

        self._write(write)

    # --- a full disk -------------------------------------------------------
    def keep_reserve(self) -> None:
        """Set some space aside (the supervisor does, at start): when the disk fills up,
        it is given back so the job's last state and events can still be written."""
        self.tolerate_full_disk = True
        with open(self.reserve_file, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)

    def _write(self, write: Callable[[], None]) -> None:
        try:
            write()
            return
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.disk_full = f"no space left on the device holding {self.path}"
            if self.reserve_file.exists():
                self.reserve_file.unlink()
                write()
                return
            if not self.tolerate_full_disk:
                raise

    def read_events(self) -> list[dict[str, Any]]:
        try:
            lines = self.events_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    # --- control ---------------------------------------------------------
    def write_control(self, control: ControlInfo) -> None:
        write_atomic(self.control_file, json.dumps(dataclasses.asdict(control)))

    def read_control(self) -> ControlInfo | None:
        try:
            return ControlInfo(
                **_known_fields(ControlInfo, json.loads(self.control_file.read_text()))
            )
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def socket_path(self, name: str) -> Path:
        """Where the supervisor's Unix socket ``name`` lives: in the job directory, or
        (a socket path must be short) in a private per-user runtime directory."""
        return short_socket_path(self.path / f"{name}.sock", f"{self.id}-{name}")

    # --- liveness --------------------------------------------------------
    def hold_lock(self) -> int:
        """Create and lock the job's lock file; returns the descriptor that holds it.
        Whoever holds it is the job's supervisor: the lock is released when it dies."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    def supervisor_alive(self) -> bool | None:
        """Whether the job's supervisor is alive (it holds the lock); None when the job
        never had one. Exact: no pid is compared, so pid reuse and reboots cannot fool it."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


@dataclass
class ControlInfo:
    """The control file: how to reach the job's supervisor (0600: it holds the secret)."""

    address: str  # unix:/path or tcp:host:port
    metrics: str  # the ZeroMQ endpoint workers send metrics to
    secret: str
    pid: int  # the supervisor
    warden_pid: int | None = None  # its parent, which cleans up if the supervisor dies


def list_job_dirs(root: Path | None = None) -> list[JobDir]:
    """Every job directory under the root, oldest first."""
    root = root or jobs_root()
    if not root.is_dir():
        return []
    dirs = [JobDir(p) for p in root.iterdir() if _is_private_job(p)]
    return sorted(dirs, key=lambda d: d.spec_file.stat().st_mtime)


def _is_private_job(path: Path) -> bool:
    try:
        JobDir(path).check_private()
    except (UnsafeJobDirectory, OSError):
        return False
    return (path / "spec.json").exists()


def find_job_dir(job_id: str, root: Path | None = None) -> JobDir:
    """Resolve a job id (or a unique prefix of one) to its directory."""
    if not JOB_ID_RE.match(job_id):
        raise KeyError(f"not a job id: {job_id!r}")
    root = root or jobs_root()
    exact = root / job_id
    if _is_private_job(exact):
        return JobDir(exact)
    matches = [d for d in list_job_dirs(root) if d.id.startswith(job_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise KeyError(f"no job {job_id!r} under {root}")
    raise KeyError(f"{job_id!r} matches several jobs: {', '.join(d.id for d in matches)}")
