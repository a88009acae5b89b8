"""Files and directories only this user may touch: the checks on a private directory,
the per-user runtime directory for sockets, the per-user cache, and atomic private
writes."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


class UnsafeJobDirectory(PermissionError):
    """A jobs root or job directory that others could have written: not trusted."""


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
    if is_private_dir(runtime):
        return runtime
    with _fallback_lock:
        if _fallback_runtime is None or not is_private_dir(_fallback_runtime):
            made = Path(tempfile.mkdtemp(prefix=f"jd-{os.getuid()}-", dir="/tmp"))
            atexit.register(shutil.rmtree, made, ignore_errors=True)
            log.warning("%s is not a private directory of this user: using %s", runtime, made)
            _fallback_runtime = made
        return _fallback_runtime


_fallback_runtime: Path | None = None  # runtime_dir's, once the shared one was refused
_fallback_lock = threading.Lock()


def is_private_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a link) of this user that only it can use."""
    try:
        info = path.lstat()
    except OSError:
        return False
    mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    return mine and stat.S_IMODE(info.st_mode) == 0o700


def cache_dir(name: str) -> Path:
    """This user's cache directory ``name``: ``$XDG_CACHE_HOME/jupyter_distrain/<name>``
    (``~/.cache`` without it), made 0700. What is kept there is run (compiled programs),
    so one that another user could write is refused (:class:`UnsafeJobDirectory`)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jupyter_distrain"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(base, "the cache directory")
    path = base / name
    path.mkdir(exist_ok=True, mode=0o700)
    check_private(path, "the cache directory")
    return path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it), ``mode``
    from the start and never through a symlink."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
