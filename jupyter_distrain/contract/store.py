"""The job directory: the single source of truth about a job, on disk, and finding one.

Layout (mode 0700)::

    <root>/<job-id>/
      spec.json       the JobSpec as submitted
      train.py        the cell body, exactly
      push.pkl        variables pushed from the notebook (--push), if any
      state.json      job state + per-process state, rewritten atomically (:mod:`.status`)
      events.jsonl    append-only history
      metrics.jsonl   what the workers reported over the metrics channel
      logs/<role>-<index>.log
      checkpoints/
      control         the supervisor's endpoint + per-job secret (0600, :class:`ControlInfo`)
      result.pkl      what rank 0 bound to ``result`` (--out), if anything
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .control import CONTROL_FILE, ControlInfo
from .private import (
    UnsafeJobDirectory,
    check_private,
    short_socket_path,
    write_atomic,
)
from .process import Env, ProcessId
from .spec import JobSpec
from .stacks import StacksReport
from .status import JobStatus

RESERVE_BYTES = 256 * 1024
# a submit takes the job's lock within moments of making its directory (pickling what
# --push names may take a while): a job never locked after this long never will be
SUBMIT_SECONDS = 60.0
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")


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


class UnreadableSpec(ValueError):
    """A job directory's spec.json is not a job's spec."""


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
    control_file = property(lambda self: self.path / CONTROL_FILE)
    lock_file = property(lambda self: self.path / "lock")
    reserve_file = property(lambda self: self.path / ".reserve")
    logs_dir = property(lambda self: self.path / "logs")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    supervisor_log = property(lambda self: self.path / "logs" / "supervisor.log")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    stacks_dir = property(lambda self: self.path / "logs" / "stacks")

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
        """spec.json; :class:`UnreadableSpec` when it is not a job's spec (damaged, or
        written by someone else), so a listing can show the job rather than fail."""
        try:
            return JobSpec.from_dict(json.loads(self.spec_file.read_text()))
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            raise UnreadableSpec(f"{self.id}: spec.json is unreadable: {exc}") from None

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
        """The notebook variables sent with ``--push`` (none when nothing was pushed): from
        what this process was handed in memory, if anything (:mod:`.handoff`)."""
        import pickle

        from .handoff import received

        handed = received(Env.HANDOFF_FD)
        if handed is not None:
            return pickle.loads(handed.pushed) if handed.pushed else {}
        try:
            with open(self.push_file, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return {}

    # --- stacks ------------------------------------------------------------
    def write_stacks(self, report: StacksReport) -> Path:
        """Keep one collection of stacks (``logs/stacks/NNN-REASON.json`` and its text,
        ``.txt``); returns the JSON file."""
        self.stacks_dir.mkdir(mode=0o700, exist_ok=True)
        number = len(list(self.stacks_dir.glob("*.json"))) + 1
        path = self.stacks_dir / f"{number:03d}-{report.reason}.json"
        self._write(lambda: write_atomic(path, json.dumps(report.to_dict())))
        self._write(lambda: write_atomic(path.with_suffix(".txt"), report.text() + "\n"))
        return path

    def read_stacks(self) -> list[StacksReport]:
        """Every collection of stacks kept, oldest first (an unreadable one left out)."""
        reports = []
        for path in sorted(self.stacks_dir.glob("*.json")):
            try:
                reports.append(StacksReport.from_dict(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return reports

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
        control.write(self.control_file)

    def read_control(self) -> ControlInfo | None:
        return ControlInfo.read(self.control_file)

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

    def never_started(self) -> bool:
        """Whether no supervisor took the job and none will: no lock was ever made, and
        the directory is older than :data:`SUBMIT_SECONDS` (its submit was interrupted, or
        its kernel died, before starting one)."""
        if self.supervisor_alive() is not None:
            return False
        try:
            return time.time() - self.spec_file.stat().st_mtime > SUBMIT_SECONDS
        except OSError:
            return True


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
    if not JOB_ID_RE.fullmatch(job_id):
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
