"""Handles on processes of this machine, as a launcher gives them to the supervisor.

- :class:`KnownProcess`: signals and memory through a ``psutil.Process`` (pid and
  start time), which refuses a pid that another process has reused since;
- :class:`LocalProcess`: one a launcher started itself (its ``Popen``);
- :class:`AdoptedProcess`: one another of ours started (an MPI rank, a pooled worker).

- :class:`PooledProcess`: one a warm pool handed over (``pool/client.claim``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time

import psutil

from .. import processes
from ..contract.launch import GpuUsage, LaunchedProcess
from ..contract.stacks import NATIVE_SECONDS
from ..pool.client import BYE_GRACE_SECONDS, EXIT_LOST, Claimed, exit_code_sent
from . import gpus

ADOPTED_POLL_SECONDS = 0.1


class KnownProcess(LaunchedProcess):
    """Signals and memory through a ``psutil.Process`` (pid and start time), which refuses
    a pid that another process has reused since."""

    process: psutil.Process
    oom: processes.OomCounter | None = None  # its memory cgroup's OOM kills, from its start
    sent_kill = False  # a SIGKILL of ours: not the OOM killer's

    def watch_oom(self) -> None:
        """Read its memory cgroup's OOM kills now (call once it runs)."""
        self.oom = processes.OomCounter.of(self.pid)

    def native_stack(self) -> str:
        return processes.native_stack(self.process, NATIVE_SECONDS)

    def oom_killed(self) -> bool:
        return not self.sent_kill and self.oom is not None and self.oom.struck()

    def signal(self, sig: int, tree: bool = False) -> None:
        self.sent_kill = self.sent_kill or sig == signal.SIGKILL
        if tree:
            processes.signal_tree(self.process, sig)
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.send_signal(sig)

    def memory_bytes(self) -> int:
        return processes.tree_rss(self.process)

    def gpu_usage(self) -> GpuUsage | None:
        return gpus.usage(self.gpus)


class LocalProcess(KnownProcess):
    """A process this launcher started."""

    def __init__(self, popen: subprocess.Popen[bytes]):
        self.popen = popen
        self.pid = popen.pid
        self.process = psutil.Process(popen.pid)
        self.create_time = self.process.create_time()
        self.watch_oom()

    def wait(self) -> int:
        return self.popen.wait()

    def poll(self) -> int | None:
        """Its exit code once it has ended, else None. ``Popen.poll()`` says None while
        another thread (its waiter) is in ``wait()``: a child that has ended is read
        here without being reaped (``WNOWAIT``: the waiter still reaps it)."""
        code = self.popen.poll()
        if code is not None:
            return code
        try:
            ended = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped meanwhile: the waiter has its code
            return self.popen.returncode
        if ended is None:
            return None
        if ended.si_code == os.CLD_EXITED:
            return ended.si_status
        return -ended.si_status  # killed by a signal, as Popen says it


class AdoptedProcess(KnownProcess):
    """A process another of ours started (an MPI rank). Its exit code is what it reports
    itself (bye), so here it is only alive or not."""

    def __init__(self, pid: int):
        self.pid = pid
        self.process = psutil.Process(pid)
        self.create_time = self.process.create_time()
        self.watch_oom()

    def poll(self) -> int | None:
        return None if processes.running(self.process) else 0

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(ADOPTED_POLL_SECONDS)
        return 0


class PooledProcess(AdoptedProcess):
    """A pooled process a job took. Its parent is the keeper, which sends its exit code
    on the claim's connection. That connection closing first (a lost keeper) leaves only
    alive-or-not: its code is then what its bye says (the supervisor takes a pooled
    process's bye), and one that ends without a bye ends with ``EXIT_LOST``, never 0."""

    def __init__(self, claimed: Claimed, process: psutil.Process):
        self.pid, self.create_time, self.process = claimed.pid, claimed.create_time, process
        self.pooled = True
        self.watch_oom()
        self._connection: socket.socket | None = claimed.connection
        self._code: int | None = None
        self._ended_at: float | None = None  # when it was seen gone, its keeper gone first
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self._code is not None or self._connection is None:
                return self._code if self._code is not None else self._without_keeper()
            readable, _, _ = select.select([self._connection], [], [], 0)
            if readable:
                self._code = exit_code_sent(self._connection)
                self._connection.close()
                self._connection = None
                return self._code if self._code is not None else self._without_keeper()
            return None

    def _without_keeper(self) -> int | None:
        """Ended with no keeper to say how: ``EXIT_LOST`` once its bye had time to come
        (it is sent before the process exits; the supervisor records it first)."""
        if super().poll() is None:
            return None
        now = time.monotonic()
        if self._ended_at is None:
            self._ended_at = now
        return EXIT_LOST if now - self._ended_at >= BYE_GRACE_SECONDS else None

    def wait(self) -> int:
        while (code := self.poll()) is None:
            connection = self._connection
            if connection is not None:
                with contextlib.suppress(OSError, ValueError):
                    select.select([connection], [], [], 1.0)
            else:
                time.sleep(ADOPTED_POLL_SECONDS)
        return code

    @classmethod
    def of(cls, claimed: Claimed | str) -> PooledProcess | None:
        """The handle of what the pool handed over; None when nothing was (why, as the
        pool said), or it has ended already (the job starts that process cold)."""
        if isinstance(claimed, str):
            return None
        process = processes.same_process(claimed.pid, claimed.create_time)
        if process is None:
            claimed.connection.close()
            return None
        return cls(claimed, process)
