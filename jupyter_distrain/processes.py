"""Process primitives every launcher, the warden, the host agent and the pool use.

- a process tree: :func:`tree_of`, :func:`signal_tree`, :func:`kill_tree`,
  :func:`tree_rss`, and this process's own descendants (:func:`kill_descendants`,
  :func:`reap_zombies`);
- identity that survives pid reuse: :func:`same_process` (pid and start time),
  :func:`kill_same`, :func:`running`;
- the environment a child started now inherits: :func:`inherited_environment`, and
  :func:`replace_environment` (the C library's, which ``os.environ`` alone misses);
- the kernel's process bonds, through ``prctl`` (here only): :func:`become_subreaper`
  (orphans below us become our children) and :func:`die_with_parent` /
  :func:`outlive_parent` (the parent-death signal);
- :func:`raise_open_files_limit`;
- whether the kernel's OOM killer struck in a process's memory cgroup: :class:`OomCounter`.

Light to import (the host agent imports it on remote hosts): the standard library and
psutil only.

Design decision
---------------

- **Nothing left behind**, three ways: every process is started in its own
  session (`killpg` reaches its children); workers get `PR_SET_PDEATHSIG`
  (SIGKILL) so they die if the supervisor is killed; and the supervisor is a
  child subreaper (`PR_SET_CHILD_SUBREAPER`, set by the local launcher), so
  orphans (ranks of a dead `mpirun`, a grandchild that `setsid`s) become its
  children, and at the end `launcher.sweep()` SIGKILLs every descendant it
  still has. Stop = SIGTERM to each process tree,
  `--grace` seconds, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
SAME_START_SECONDS = 0.01  # two start times this close are one process's


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def become_subreaper() -> None:
    """Make orphans of this process's descendants its children, not init's."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (a ``preexec_fn``)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def outlive_parent() -> None:
    """Undo :func:`die_with_parent`: this process now outlives its parent."""
    _prctl(_PR_SET_PDEATHSIG, 0)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (1024 is the
    usual soft one, against 20000 to a million hard): a server any host can connect to
    holds a descriptor for each connection until it is dropped, and the supervisor's
    must outlast a peer that opens them faster than that. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def inherited_environment() -> dict[str, str]:
    """What a child started now inherits: the C library's ``environ``. ``os.environ``
    misses what native code set with ``setenv`` (under pytest, ``COLUMNS``)."""
    try:
        entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return dict(os.environ)
    env: dict[str, str] = {}
    index = 0
    while entries[index] is not None:
        name, sep, value = os.fsdecode(entries[index]).partition("=")
        if sep:
            env.setdefault(name, value)
        index += 1
    return env


def replace_environment(env: dict[str, str]) -> None:
    """Make ``env`` this process's whole environment, ``os.environ`` and the C
    library's alike (what it inherited and native code set included)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).clearenv()
    os.environ.clear()
    os.environ.update(env)


def same_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The running process ``pid`` if it is the one that started at ``create_time``."""
    if not pid or create_time is None:
        return None
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) < SAME_START_SECONDS:
            return process
    except psutil.NoSuchProcess:
        pass
    return None


def running(process: psutil.Process) -> bool:
    """Whether ``process`` (the one psutil knows, not a reuse of its pid) still runs."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree_of(process: psutil.Process) -> list[psutil.Process]:
    """The process and every descendant that is still there."""
    try:
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# how old the parent map tree_rss reads may be: one scan of the process table serves a
# whole sampling tick of a job's processes
PARENT_MAP_SECONDS = 0.5


class _ParentMap:
    """Every process's children, from one scan of the process table, kept for
    :data:`PARENT_MAP_SECONDS`. psutil's ``children()`` scans the whole table on every
    call: sampling each of a job's N processes that way cost N scans of N+ processes a
    tick (74% of a 128-rank job's supervisor CPU, measured by py-spy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = -PARENT_MAP_SECONDS
        self._children: dict[int, list[psutil.Process]] = {}

    def children(self, pid: int) -> list[psutil.Process]:
        """``pid``'s children as of the last scan (made now if it is too old)."""
        with self._lock:
            if time.monotonic() - self._read_at >= PARENT_MAP_SECONDS:
                children: dict[int, list[psutil.Process]] = defaultdict(list)
                for proc in psutil.process_iter(["ppid"]):
                    children[proc.info["ppid"]].append(proc)
                self._children, self._read_at = children, time.monotonic()
            return self._children.get(pid, [])


_parents = _ParentMap()


def tree_rss(process: psutil.Process | int) -> int:
    """The resident memory of a process and its descendants together (the descendants as
    of a scan at most :data:`PARENT_MAP_SECONDS` old); 0 once it is gone."""
    if isinstance(process, int):
        try:
            process = psutil.Process(process)
        except psutil.NoSuchProcess:
            return 0
    if not running(process):  # gone, or its pid is another process's now
        return 0
    total, members, seen = 0, [process], set()
    while members:
        member = members.pop()
        if member.pid in seen:
            continue
        seen.add(member.pid)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += member.memory_info().rss
            members.extend(_parents.children(member.pid))
    return total


def native_stack(process: psutil.Process, timeout: float) -> str:
    """``py-spy dump --native --pid PID``: every thread's native and Python frames, read
    without stopping the process for long; or one line saying why not (not installed,
    not permitted to read it, ended). ``process`` is known by its pid and start time:
    py-spy is not attached to another process that took its pid, and what it read is
    dropped when the pid was taken meanwhile."""
    pid = process.pid
    if not running(process):
        return f"native frames: process {pid} has ended"
    spy = shutil.which(
        "py-spy", path=f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
    )
    if spy is None:
        return "native frames: py-spy is not installed (pip install py-spy)"
    try:
        done = subprocess.run(
            [spy, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"native frames: py-spy took over {timeout:g} s on process {pid}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[0]
        return f"native frames: py-spy could not read process {pid}: {said}"
    if not running(process):
        return f"native frames: process {pid} ended while py-spy read it"
    return done.stdout


class OomCounter:
    """The kernel's count of processes its OOM killer ended in one process's memory
    cgroup (cgroup v1 ``memory.oom_control``, v2 ``memory.events``: the killer counts
    its victim there, whether the limit hit was the cgroup's or the machine's), read when
    the process started: a later count above it, for a process that died of a SIGKILL
    nobody of ours sent, says the OOM killer ended it."""

    def __init__(self, path: str, at_start: int):
        self.path, self.at_start = path, at_start

    @classmethod
    def of(cls, pid: int) -> OomCounter | None:
        """The counter of ``pid``'s memory cgroup; None where none can be read."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = [line.rstrip("\n").split(":", 2) for line in f]
        except OSError:
            return None
        v1 = [
            f"/sys/fs/cgroup/memory{p}/memory.oom_control"
            for _, c, p in lines
            if "memory" in c.split(",")
        ]
        v2 = [
            f"{root}{p}/memory.events"
            for h, _, p in lines
            if h == "0"
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
        ]
        for path in v1 or v2:
            count = _oom_kills(path)
            if count is not None:
                return cls(path, count)
        return None

    def struck(self) -> bool:
        """Whether the OOM killer ended a process of that cgroup since."""
        count = _oom_kills(self.path)
        return count is not None and count > self.at_start


def _oom_kills(path: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def signal_tree(process: psutil.Process, sig: int) -> None:
    """Signal a process, its whole process group, and descendants that left the group."""
    members = tree_of(process)
    with contextlib.suppress(ProcessLookupError, PermissionError, psutil.NoSuchProcess):
        if process.is_running():
            os.killpg(os.getpgid(process.pid), sig)
    for member in members[1:]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)


def signal_pid(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` (a child of this process's, whose pid cannot be reused
    before it is reaped); False when it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_group(pgid: int) -> bool:
    """SIGKILL process group ``pgid`` (one this process started as its leader, not yet
    reaped); False when it is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def private_bytes(pid: int) -> int:
    """The memory only ``pid`` holds (its unique set size); 0 if it cannot be read."""
    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except psutil.Error:
        return 0


def rss(pid: int) -> int:
    """The resident memory of ``pid`` alone; 0 if it cannot be read."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def start_time(pid: int) -> float | None:
    """When ``pid`` started (with the pid, what names one process exactly); None: gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def any_running(pids: list[int]) -> bool:
    """Whether any of ``pids`` is a process of this machine's (a reused pid counts)."""
    return any(psutil.pid_exists(pid) for pid in pids)


def kill_pid_tree(pid: int) -> None:
    """SIGKILL ``pid`` (a child of this process's, not yet reaped), its process group
    and everything below it."""
    with contextlib.suppress(psutil.NoSuchProcess):
        signal_tree(psutil.Process(pid), signal.SIGKILL)


def end_child(popen: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a child this process started, SIGKILL it after ``grace`` seconds, reap it."""
    with contextlib.suppress(ProcessLookupError):
        popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def kill_left_behind(ended: int, variable: str, value: str, keep: set[int]) -> None:
    """SIGKILL (with their trees) this process's children but ``keep`` that process
    ``ended`` left behind: of its session, or with ``variable=value`` in their
    environment (this process is a child subreaper: orphans become its children)."""
    for child in psutil.Process().children():
        if child.pid in keep:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(child.pid) == ended or (value and child.environ().get(variable) == value):
                signal_tree(child, signal.SIGKILL)


def kill_tree(pid: int | None, create_time: float | None) -> bool:
    """SIGKILL the process ``pid`` (if it is still the one started at ``create_time``),
    its process group and everything below it; whether it was still there."""
    process = same_process(pid, create_time)
    if process is not None:
        signal_tree(process, signal.SIGKILL)
    return process is not None


def kill_same(processes: dict[int, float]) -> list[int]:
    """SIGKILL each ``pid: start time`` that is still that process; the pids killed."""
    killed = []
    for pid, started in processes.items():
        process = same_process(pid, started)
        if process is not None:
            with contextlib.suppress(psutil.Error):
                process.kill()
                killed.append(pid)
    return killed


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process; the pids killed."""
    killed = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
            killed.append(child.pid)
    return killed


def reap_zombies(keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Collect this process's children that have ended, but for ``keep`` (children
    that a ``Popen`` object waits for)."""
    for child in psutil.Process().children():
        if child.pid in keep:
            continue
        with contextlib.suppress(ChildProcessError, psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
