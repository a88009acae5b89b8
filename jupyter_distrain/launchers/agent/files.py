"""The job's directory on a host, as the host agent keeps it: where it is and who made
it, the files that go in (unpacked from the launcher's archive, private), what comes
back (packed as it is read: the result and checkpoints only), a session's cell files
(in memory where the node has a memory file system), the sockets ssh forwards into it,
and its removal. Used by the agent's commands (:mod:`.host`), the Slurm task and the
Ray slot's actor."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import shutil
import socket
import stat
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

from ...contract.private import write_atomic
from ...contract.session import CELLS_DIR, is_cell_file

JOBS_ROOT = ".jupyter_distrain/jobs"  # under the user's home: JOB/HOSTNAME per job and host
UNPACKED = ".unpacked"  # in a job's host directory: the generation whose files are there
OWNER = "owner"  # in a job's host directory: the id of the notebook that made it
COPIED = ("spec.json", "train.py", "push.pkl", "control")  # what a host needs of a job
HANDED = ("push.pkl", "control")  # of those, what a Ray node gets in memory instead
CARRIED = ("checkpoints",)  # what a restarted job takes back to its hosts (Keras backups)
RESULT = "result.pkl"  # what rank 0 bound to ``result`` (--out)
CHECKPOINTS = "checkpoints"
RETURNED = (RESULT, CHECKPOINTS)  # what ``send`` sends back; the notebook accepts no more
MEMORY_FS = Path("/dev/shm")  # a memory file system (tmpfs) on Linux nodes


def sockets_dir(home: str, hostname: str) -> str:
    """Where ssh forwards the supervisor's sockets on the host named ``hostname``
    (under ``home``): one private directory per host (hosts may share a home), named by
    a digest of the name so that a long one does not lengthen the sockets' paths."""
    import hashlib

    digest = hashlib.sha256(hostname.encode()).hexdigest()[:10]
    return f"{home}/{JOBS_ROOT}/.sockets-{digest}"


def own_sockets_dir() -> Path:
    """This host's :func:`sockets_dir`."""
    return Path(sockets_dir(str(Path.home()), socket.gethostname()))


def socket_name(job_id: str, start: int, channel: str) -> str:
    """The name of the socket forwarded for the launcher's ``start``-th process of job
    ``job_id`` to the supervisor's ``channel`` ("control", "metrics")."""
    return f"{job_id}-{start}-{channel}.sock"


def remove_sockets(job_id: str) -> None:
    """Remove the forwarded sockets of job ``job_id`` here (only that job's: a job may
    be named like another's id)."""
    import re

    own = re.compile(re.escape(job_id) + r"-\d+-(control|metrics)\.sock")
    with contextlib.suppress(OSError):
        for path in own_sockets_dir().iterdir():
            if own.fullmatch(path.name):
                with contextlib.suppress(OSError):
                    path.unlink()


def make_private_dir(path: Path) -> None:
    """``path`` as a new or existing directory of this user, 0700, parents included."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory of this user")
    path.chmod(0o700)


def unpack(directory: Path, data: bytes, owner: str = "") -> None:
    """Extract the job's files (a tar) into ``directory``, made private first and marked
    as notebook ``owner``'s (so a later pre-flight of that notebook can remove it)."""
    make_private_dir(directory.parent)
    make_private_dir(directory)
    if owner:
        write_private(directory / OWNER, owner)
    for name in ("logs", "checkpoints"):
        make_private_dir(directory / name)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        extract_data(tar, directory)
    for name in COPIED:
        with contextlib.suppress(FileNotFoundError):
            (directory / name).chmod(0o600)


def extract_data(tar: tarfile.TarFile, directory: Path) -> None:
    """Extract ``tar`` into ``directory`` under tarfile's ``data`` filter: regular files
    and directories inside it, no links or devices, no set-id bits. Pythons before 3.11.4
    (Debian 12's is 3.11.2) have no extraction filters: there the same rule is applied
    here, refusing the whole archive if one member breaks it."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(directory, filter="data")
        return
    members = []
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if member.name.startswith("/") or ".." in parts or not (member.isreg() or member.isdir()):
            raise tarfile.TarError(f"refused archive member {member.name!r}")
        member.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        members.append(member)
    tar.extractall(directory, members=members)


def pack(directory: Path, out: IO[bytes]) -> None:
    """Write a tar of what comes back from ``directory`` (:data:`RETURNED`) to ``out``,
    member by member as it is read (never the whole archive in memory): regular files
    and directories only; links, sockets and devices stay behind."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in RETURNED:
            _add_tree(tar, directory, name)


def _add_tree(tar: tarfile.TarFile, directory: Path, name: str) -> None:
    path = directory / name
    try:
        mode = path.lstat().st_mode
    except OSError:  # absent (no result, no checkpoint), or gone meanwhile
        return
    if stat.S_ISREG(mode):
        tar.add(path, name, recursive=False)
    elif stat.S_ISDIR(mode):
        tar.add(path, name, recursive=False)
        for child in sorted(os.listdir(path)):
            _add_tree(tar, directory, f"{name}/{child}")


def remove(directory: Path) -> None:
    """Remove the job's directory here (and the job's, once no host directory is left)
    and its forwarded sockets."""
    remove_sockets(directory.parent.name)
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.parent.rmdir()


def cells_in_memory(directory: Path) -> Path | None:
    """Put a session's cell files of the process about to run in ``directory`` (its
    pushed values, its results) in memory rather than on the node's disk: ``session/``
    becomes a link to a private directory (0700) of the node's memory file system, made
    here and removed by :func:`forget_cells` when the process ends. Those a killed
    agent left are removed first. None (the files on the disk, as on an ssh host)
    where the node has no memory file system."""
    import psutil

    if not MEMORY_FS.is_dir():
        return None
    prefix = f"jupyter_distrain-cells-{os.getuid()}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(MEMORY_FS):
            pid = name.removeprefix(prefix).split("-")[0]
            if name.startswith(prefix) and pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(MEMORY_FS / name, ignore_errors=True)
    try:
        place = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=MEMORY_FS))
        link = directory / CELLS_DIR
        if link.is_symlink():
            link.unlink()
        os.symlink(place, link)
    except OSError:
        return None
    return place


def forget_cells(directory: Path, place: Path | None) -> None:
    """Remove what :func:`cells_in_memory` made: the memory directory and its link."""
    if place is not None:
        shutil.rmtree(place, ignore_errors=True)
        link = directory / CELLS_DIR
        if link.is_symlink():
            link.unlink()


def write_private(path: Path, text: str) -> None:
    """``text`` into a new file ``path`` of this user, 0600 (never through a link)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def owner_of(directory: Path) -> str:
    """The notebook id a job's host directory is marked with ("" when none, or when it
    is not this user's own directory)."""
    try:
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return ""
        fd = os.open(directory / OWNER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd) as marker:
        return marker.read(200).strip()


def write_cell_file(directory: Path, name: str, data: str) -> None:
    """A session's cell file, relayed by the supervisor, into the job's directory here
    (only the names a cell has: ``session/N.json``, ``session/N.push.pkl``)."""
    if not is_cell_file(name):
        sys.stderr.write(f"not a cell file: {name[:80]!r}\n")
        return
    (directory / CELLS_DIR).mkdir(mode=0o700, exist_ok=True)
    write_atomic(directory / name, base64.b64decode(data))
