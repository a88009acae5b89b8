"""What the hosts of a job send back at its end, and what of it the notebook side keeps.

Each host's agent streams a tar of what the job produced there (:func:`.files.pack`,
its ``send`` command). Whatever the host's Python or :mod:`tarfile` does, the notebook
side decides what it accepts: it never lets :mod:`tarfile` extract anything, but reads
the members one by one as they arrive and writes, itself, only what it accepts from
that host:

- ``result.pkl`` (``Job.result()`` unpickles it in the kernel) only from the host of
  the process that stores the job's result (rank 0: :func:`result_slots`);
- directories and files under ``checkpoints/`` from that host only: what comes back is
  handed to every host of the next generation (a restart, a scale) and loaded there
  (``torch.distributed.checkpoint`` reads its metadata with pickle), so one host's files
  must never reach the others unless they are rank 0's, whose ``result.pkl`` the kernel
  itself loads; another host's checkpoint files are left out without a warning (a
  replicated checkpoint, which every host writes whole, is rank 0's host's copy);
- regular files and directories only: links, devices, fifos, absolute names and ``..``
  are refused, and so is every other name (the job's own ``state.json``,
  ``events.jsonl``, ``metrics.jsonl``, logs, ...).

Each file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (0600) in a staging directory
of the host's own (0700, made in the job directory), every path opened one directory at
a time without following links, and moved into place only once the host's whole archive
has been read and its sender ended well: a host's files come all or none. What a host
sends is read as it comes (never whole in memory) and capped per file and per host
(:class:`Limits`). A refused entry is one warning line naming the host and the entry;
it changes neither the job's outcome nor what the other hosts sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ...contract.launch import ProcessSpec, Slot
from ...contract.process import Env
from .files import CHECKPOINTS, RESULT

log = logging.getLogger(__name__)

GIB = 2**30
MAX_FILE_BYTES = 16 * GIB  # the largest file one host may send
MAX_HOST_BYTES = 64 * GIB  # the most one host's archive may hold, refused entries included
MAX_ENTRIES = 100_000  # members in one host's archive
MAX_HEADER_BYTES = 1 << 20  # a pax or GNU long-name header (tarfile holds it in memory)
MAX_WARNINGS = 20  # refused entries named one by one per host; the rest are counted
CHUNK_BYTES = 1 << 20  # read and written at a time
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# errors that say the notebook's side cannot store anything more (not one entry's fault)
_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}
_HEADER_TYPES = (  # headers tarfile reads whole: a pax header, a GNU long name
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much one host may send."""

    file_bytes: int = MAX_FILE_BYTES
    host_bytes: int = MAX_HOST_BYTES
    entries: int = MAX_ENTRIES


@dataclasses.dataclass
class Received:
    """What became of one host's archive."""

    source: str  # the host, as warnings name it
    stored: list[str] = dataclasses.field(default_factory=list)  # now in the job directory
    refused: list[str] = dataclasses.field(default_factory=list)  # "name: why", one each
    left: list[str] = dataclasses.field(default_factory=list)  # checkpoints not rank 0's host's
    problem: str = ""  # why none of it was kept ("" when it was read whole and stored)

    @property
    def complete(self) -> bool:
        """Whether all the host sent was read and what was accepted stored: the host's
        copy may go."""
        return not self.problem


class StopReading(Exception):
    """This host's archive cannot be read on (a limit, a broken stream, a full disk)."""


def result_slots(proc: ProcessSpec) -> list[Slot]:
    """Where ``proc``, or a member it starts (mpirun's ranks), stores the job's result:
    the worker of rank 0 writes ``result.pkl`` (a TensorFlow server and a ps never do)."""
    if proc.env.get(Env.MODE) == "server":
        return []
    if proc.hosts:  # mpirun: MPI rank i is worker i, in slot i
        return [s for member, s in proc.hosts.items() if member.role == "worker" and s.index == 0]
    if proc.rank == 0 and proc.id.role != "ps" and proc.slot is not None:
        return [proc.slot]
    return []


class Delivery:
    """The archives the hosts of one job send back at its end, each taken in by one
    :meth:`receive` (hosts may be received in parallel threads). ``warn`` gets each
    warning line for the user."""

    def __init__(self, job_path: Path, warn: Callable[[str], None], limits: Limits | None = None):
        self.job_path = job_path
        self.warn = warn
        self.limits = limits or Limits()
        self._lock = threading.Lock()  # one host moves its files into place at a time

    def receive(self, source: str, stream: IO[bytes], result: bool) -> Received:
        """Read ``source``'s archive from ``stream`` to its end and keep what it may send
        (``result``: it is the host of the result). ``stream.read`` raising (a timeout, the
        sender failed) means nothing of this host is kept."""
        received = Received(source)
        try:
            staging = tempfile.mkdtemp(prefix=".incoming-", dir=self.job_path)
        except OSError as exc:
            received.problem = f"cannot stage its files here: {exc.strerror}"
            return received
        try:
            staged = self._stage(stream, staging, result, received)
            if not received.problem:
                with self._lock:
                    self._commit(staging, staged, result, received)
        except OSError as exc:  # the job directory itself (gone, unreadable)
            received.problem = f"cannot store its files here: {exc.strerror or exc}"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        left = len(received.refused) - MAX_WARNINGS
        if left > 0:
            self.warn(f"{source}: refused {left} more entries of what it sent back")
        if received.left:
            log.info(
                "%s: %d checkpoint entries not kept (not rank 0's host)", source, len(received.left)
            )
        return received

    # --- reading ---------------------------------------------------------------------
    def _stage(
        self, stream: IO[bytes], staging: str, result: bool, received: Received
    ) -> list[tuple[tuple[str, ...], bool]]:
        """Write what ``received.source`` may send into ``staging``; (path, is a
        directory) of each entry written."""
        capped = _Capped(stream, self.limits.host_bytes)
        staged: list[tuple[tuple[str, ...], bool]] = []
        root = os.open(staging, _DIR_FLAGS)
        try:
            with tarfile.open(
                fileobj=capped, mode="r|", tarinfo=_BoundedTarInfo, bufsize=1 << 16
            ) as tar:
                for count, member in enumerate(tar, 1):
                    if count > self.limits.entries:
                        raise StopReading(f"it sent more than {self.limits.entries} entries")
                    parts = self._take(tar, member, root, result, received)
                    if parts is not None:
                        staged.append((parts, member.isdir()))
            while capped.read(CHUNK_BYTES):  # to the end: the sender's outcome comes there
                pass
        except StopReading as stop:
            received.problem = str(stop)
        except Exception as exc:  # a broken archive, a lost connection, a failed sender
            received.problem = f"its archive is unreadable: {one_line(exc)}"
        finally:
            os.close(root)
        return staged

    def _take(
        self,
        tar: tarfile.TarFile,
        member: tarfile.TarInfo,
        root: int,
        result: bool,
        received: Received,
    ) -> tuple[str, ...] | None:
        """Stage ``member`` if the policy allows it; its path, or None when refused."""
        parts = _parts(member.name)
        why = parts if isinstance(parts, str) else self._refusal(member, parts, result)
        if why:
            self._refuse(received, member.name, why)
            return None
        if parts[0] == CHECKPOINTS and not result:
            received.left.append(member.name)  # rank 0's host's copy is the job's
            return None
        assert isinstance(parts, tuple)
        try:
            if member.isdir():
                os.close(_open_dirs(root, parts, create=True))
            else:
                _write(root, parts, tar, member)
        except FileExistsError:
            self._refuse(received, member.name, "a second entry of that name")
            return None
        except OSError as exc:
            if exc.errno in _STORAGE_ERRORS:
                raise StopReading(f"cannot store {member.name!r} here: {exc.strerror}") from None
            self._refuse(received, member.name, _reason(exc))
            return None
        return parts

    def _refusal(self, member: tarfile.TarInfo, parts: tuple[str, ...], result: bool) -> str:
        """Why ``member`` (at ``parts``) is refused from this host; "" when it is not."""
        if member.issym():
            return "a symbolic link"
        if member.islnk():
            return "a hard link"
        if member.ischr() or member.isblk():
            return "a device node"
        if member.isfifo():
            return "a fifo"
        if not (member.isreg() or member.isdir()):
            return "not a regular file or a directory"
        if parts == (RESULT,):
            if not member.isreg():
                return f"{RESULT} must be a file"
            if not result:
                return f"{RESULT} comes only from the host of rank 0"
        elif parts[0] == CHECKPOINTS:
            if len(parts) == 1 and not member.isdir():
                return f"{CHECKPOINTS} must be a directory"
        else:
            return f"only {RESULT} and {CHECKPOINTS}/ come back from a host"
        if member.isreg() and member.size > self.limits.file_bytes:
            return f"{member.size} bytes, over the limit of {self.limits.file_bytes} per file"
        return ""

    def _refuse(self, received: Received, name: str, why: str) -> None:
        received.refused.append(f"{name!r}: {why}")
        if len(received.refused) <= MAX_WARNINGS:
            self.warn(f"{received.source}: refused {name!r} of what it sent back: {why}")

    # --- moving into place -------------------------------------------------------------
    def _commit(
        self,
        staging: str,
        staged: list[tuple[tuple[str, ...], bool]],
        result: bool,
        received: Received,
    ) -> None:
        """Move each staged entry to the same path in the job directory."""
        job = os.open(self.job_path, _DIR_FLAGS)
        stage = os.open(staging, _DIR_FLAGS)
        try:
            for parts, is_dir in staged:
                name = "/".join(parts)
                try:
                    _move(stage, job, parts, is_dir)
                except OSError as exc:
                    if exc.errno in _STORAGE_ERRORS:
                        received.problem = f"cannot store {name!r} here: {exc.strerror}"
                        return
                    self._refuse(received, name, f"cannot put it in place: {_reason(exc)}")
                    continue
                received.stored.append(name)
        finally:
            os.close(stage)
            os.close(job)


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header that tarfile may not read whole into memory when it is huge (a
    pax or GNU long-name header), no sparse file (no host sends one), and an archive
    that ends or breaks before its end-of-archive block is broken (tarfile would take
    it for the end)."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        try:
            return super().frombuf(buf, encoding, errors)
        except tarfile.EOFHeaderError:  # the end-of-archive block
            raise
        except tarfile.HeaderError as exc:
            raise StopReading(f"its archive is broken: {exc}") from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise StopReading(f"{self.name!r} is a sparse file")
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            limit = MAX_HEADER_BYTES
            raise StopReading(f"a header of {self.size} bytes, over the limit of {limit}")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _parts(name: str) -> tuple[str, ...] | str:
    """The components of a member's name, or why the name is refused."""
    if name.startswith("/"):
        return "an absolute name"
    if "\0" in name:
        return "a name with a NUL byte"
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        return "a name with '..'"
    if not parts:
        return "an empty name"
    return parts


def _open_dirs(root: int, parts: tuple[str, ...], create: bool) -> int:
    """A descriptor of the directory at ``parts`` under the directory ``root``, opened
    one component at a time without following links (made 0700 where missing, with
    ``create``)."""
    fd = os.dup(root)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write(
    root: int, parts: tuple[str, ...], tar: tarfile.TarFile, member: tarfile.TarInfo
) -> None:
    """The member's data into a new file at ``parts`` (0600; never through a link)."""
    parent = _open_dirs(root, parts[:-1], create=True)
    try:
        fd = os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        source = tar.extractfile(member)
        assert source is not None  # a regular file
        left = member.size
        while left:
            chunk = source.read(min(CHUNK_BYTES, left))
            if not chunk:
                raise StopReading(f"its archive ends inside {member.name!r}")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            left -= len(chunk)
        with contextlib.suppress(OSError, OverflowError, ValueError):
            os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(fd)


def _move(stage: int, job: int, parts: tuple[str, ...], is_dir: bool) -> None:
    """The staged entry at ``parts`` to the same path under ``job`` (a directory: made
    there; a file: renamed over what is there)."""
    if is_dir:
        os.close(_open_dirs(job, parts, create=True))
        return
    source = _open_dirs(stage, parts[:-1], create=False)
    try:
        target = _open_dirs(job, parts[:-1], create=True)
        try:
            os.replace(parts[-1], parts[-1], src_dir_fd=source, dst_dir_fd=target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a parent of it is not a directory"
    return exc.strerror or type(exc).__name__


def one_line(exc: BaseException) -> str:
    """What ``exc`` says, on one line (a Ray error's first line, say)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# --- streams ----------------------------------------------------------------------------
class _Capped:
    """``stream``, raising :class:`StopReading` once more than ``limit`` bytes came."""

    def __init__(self, stream: IO[bytes], limit: int):
        self.stream = stream
        self.limit = limit
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(CHUNK_BYTES if size is None or size < 0 else size)
        self.count += len(data)
        if self.count > self.limit:
            raise StopReading(f"it sent more than {self.limit} bytes")
        return data


class PipeStream:
    """A pipe's bytes (an ssh session's stdout), raising ``TimeoutError`` when nothing
    came for ``idle`` seconds or the whole took over ``total``; at its end ``ended()``
    is called, which raises when the sender failed."""

    def __init__(self, pipe: IO[bytes], idle: float, total: float, ended: Callable[[], None]):
        self.fd = pipe.fileno()
        self.idle = idle
        self.deadline = time.monotonic() + total
        self.total = total
        self.ended = ended
        self._done = False

    def read(self, size: int = -1) -> bytes:
        if self._done:
            return b""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"it took over {self.total:g} s")
        ready, _, _ = select.select([self.fd], [], [], min(self.idle, left))
        if not ready:
            raise TimeoutError(f"nothing came for {min(self.idle, left):g} s")
        data = os.read(self.fd, CHUNK_BYTES if size < 0 else size)
        if not data:
            self._done = True
            self.ended()
        return data


class PulledStream:
    """Bytes fetched a chunk at a time (``fetch(n)``: the next at most ``n``, b"" at the
    end), e.g. from a Ray actor on the host."""

    def __init__(self, fetch: Callable[[int], bytes]):
        self.fetch = fetch
        self._chunk = memoryview(b"")
        self._done = False

    def read(self, size: int = -1) -> bytes:
        if not self._chunk and not self._done:
            self._chunk = memoryview(self.fetch(CHUNK_BYTES))
            self._done = not self._chunk
        size = len(self._chunk) if size < 0 else size
        data, self._chunk = bytes(self._chunk[:size]), self._chunk[size:]
        return data
