"""Local launcher: every worker is a process on this machine, in its own process group."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .base import LaunchedProcess, Launcher, ProcessSpec, Slot
from .limits import CpuQuota, cpu_set, thread_env

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this child if the supervisor dies (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LocalProcess(LaunchedProcess):
    def __init__(self, popen: subprocess.Popen[bytes]):
        self.popen = popen
        self.pid = popen.pid

    def wait(self) -> int:
        return self.popen.wait()

    def poll(self) -> int | None:
        return self.popen.poll()


class LocalLauncher(Launcher):
    """Runs every process on this machine, with CPU affinity/quota from ``--cpu``."""

    name = "local"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._quotas: list[CpuQuota] = []

    def place(self, n: int) -> list[Slot]:
        return [
            Slot(host="localhost", address="127.0.0.1", index=i, local_index=i) for i in range(n)
        ]

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        env = {**os.environ, **thread_env(self.spec.cpu), **self.spec.env, **proc.env}
        cpus = cpu_set(proc.slot.index, self.spec.cpu) if proc.slot is not None else None

        def preexec() -> None:
            _die_with_parent()
            if cpus:
                os.sched_setaffinity(0, cpus)

        with open(log_path, "ab", buffering=0) as log:
            popen = subprocess.Popen(
                proc.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.spec.workdir if os.path.isdir(self.spec.workdir) else None,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        if self.spec.cpu is not None and self.spec.cpu % 1:
            quota = CpuQuota(f"{self.job.id}-{proc.label}", self.spec.cpu)
            quota.add(popen.pid)
            self._quotas.append(quota)
        return LocalProcess(popen)

    def close(self) -> None:
        for quota in self._quotas:
            quota.close()
