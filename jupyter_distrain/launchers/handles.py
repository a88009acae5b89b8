"""Handles on processes of this machine, as a launcher gives them to the supervisor.

- :class:`KnownProcess`: signals and memory through a ``psutil.Process`` (pid and
  start time), which refuses a pid that another process has reused since;
- :class:`LocalProcess`: one a launcher started itself (its ``Popen``);
- :class:`AdoptedProcess`: one another of ours started (an MPI rank, a pooled worker).

Apart from the launchers so that the pool's handle can build on them without
importing a launcher.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import psutil

from .. import processes
from . import gpus
from .base import LaunchedProcess

ADOPTED_POLL_SECONDS = 0.1


class KnownProcess(LaunchedProcess):
    """Signals and memory through a ``psutil.Process`` (pid and start time), which refuses
    a pid that another process has reused since."""

    process: psutil.Process

    def signal(self, sig: int, tree: bool = False) -> None:
        if tree:
            processes.signal_tree(self.process, sig)
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.send_signal(sig)

    def memory_bytes(self) -> int:
        return processes.tree_rss(self.process)

    def gpu_usage(self) -> gpus.GpuUsage | None:
        return gpus.usage(self.gpus)


class LocalProcess(KnownProcess):
    """A process this launcher started."""

    def __init__(self, popen: subprocess.Popen[bytes]):
        self.popen = popen
        self.pid = popen.pid
        self.process = psutil.Process(popen.pid)
        self.create_time = self.process.create_time()

    def wait(self) -> int:
        return self.popen.wait()

    def poll(self) -> int | None:
        return self.popen.poll()


class AdoptedProcess(KnownProcess):
    """A process another of ours started (an MPI rank). Its exit code is what it reports
    itself (bye), so here it is only alive or not."""

    def __init__(self, pid: int):
        self.pid = pid
        self.process = psutil.Process(pid)
        self.create_time = self.process.create_time()

    def poll(self) -> int | None:
        return None if processes.running(self.process) else 0

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(ADOPTED_POLL_SECONDS)
        return 0
