"""Local launcher: every process on this machine, in its own session, dying with the supervisor."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ..contract.process import ProcessId
from ..contract.spec import JobSpec, SpecError
from ..contract.store import JobStatus
from . import gpus
from .base import LaunchedProcess, Launcher, ProcessSpec, Slot
from .isolation import private_network
from .limits import CpuQuota, cpu_set, thread_env

log = logging.getLogger(__name__)

WORKER_MODULE = "jupyter_distrain.worker"
PROCESSES_PER_CORE = 4  # oversubscription a local job may ask for
MIN_PROCESS_LIMIT = 8
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
ADOPTED_POLL_SECONDS = 0.1


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this child if the supervisor dies."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def tree_of(process: psutil.Process) -> list[psutil.Process]:
    """The process and every descendant that is still there."""
    try:
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in tree_of(process):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def signal_tree(process: psutil.Process, sig: int) -> None:
    """Signal a process, its whole process group, and descendants that left the group."""
    members = tree_of(process)
    with contextlib.suppress(ProcessLookupError, PermissionError, psutil.NoSuchProcess):
        if process.is_running():
            os.killpg(os.getpgid(process.pid), sig)
    for member in members[1:]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)


def same_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The running process ``pid`` if it is the one that started at ``create_time``."""
    if not pid or create_time is None:
        return None
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) < 0.01:
            return process
    except psutil.NoSuchProcess:
        pass
    return None


class KnownProcess(LaunchedProcess):
    """Signals and memory through a ``psutil.Process`` (pid and start time), which refuses
    a pid that another process has reused since."""

    process: psutil.Process

    def signal(self, sig: int, tree: bool = False) -> None:
        if tree:
            signal_tree(self.process, sig)
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.send_signal(sig)

    def memory_bytes(self) -> int:
        return tree_rss(self.process)

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
        try:
            running = self.process.status() != psutil.STATUS_ZOMBIE and self.process.is_running()
        except psutil.NoSuchProcess:
            running = False
        return None if running else 0

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(ADOPTED_POLL_SECONDS)
        return 0


@dataclasses.dataclass(frozen=True)
class _Launch:
    """Everything one process is started with, cold or from the pool."""

    proc: ProcessSpec
    env: dict[str, str]
    cwd: str | None
    cpus: set[int] | None
    log_path: Path


class LocalLauncher(Launcher):
    """Runs every process on this machine, with CPU affinity/quota from ``--cpu``.

    The supervisor becomes a child subreaper, so orphans of the job's processes
    (ranks whose mpirun died, a grandchild that ``setsid``s) become its children:
    :meth:`sweep` kills them and :meth:`reap` collects them.
    """

    name = "local"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._quotas: list[CpuQuota] = []
        self._gpus = gpus.GpuAllocator(self.spec)
        self._started: set[int] = set()
        self._pooled_ids: set[ProcessId] = set()  # processes that could come from the pool
        self._pool_env: dict[str, str] | None = None
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        cores = len(os.sched_getaffinity(0))
        limit = max(MIN_PROCESS_LIMIT, PROCESSES_PER_CORE * cores)
        what = f"--workers {spec.workers}" + (f" --ps {spec.ps}" if spec.ps else "")
        if processes > limit:
            raise SpecError(
                f"{what}: the job needs {processes} processes; this machine runs at most "
                f"{limit} for one job ({cores} cores)"
            )
        # cores may be shared (the seed's cpu=0.5 on a laptop), within the same bound
        if spec.cpu is not None and spec.cpu * processes > PROCESSES_PER_CORE * cores:
            raise SpecError(
                f"--cpu {spec.cpu:g}: {processes} processes need {spec.cpu * processes:g} cores; "
                f"this machine has {cores} (at most {PROCESSES_PER_CORE}x shared)"
            )
        total = psutil.virtual_memory().total / 2**30
        if spec.memory is not None and spec.memory * processes > total:
            raise SpecError(
                f"--memory {spec.memory:g}: {processes} processes need "
                f"{spec.memory * processes:g} GiB; this machine has {total:.1f} GiB"
            )
        devices = gpus.choose(spec, processes, gpus.discover() if spec.gpus else [])
        return dataclasses.replace(spec, gpu_ids=devices)

    @classmethod
    def choose_pool(cls, spec: JobSpec, environ: dict[str, str]) -> JobSpec:
        from ..pool import client, kinds

        kind = kinds.KIND_OF_BACKEND.get(spec.backend)
        if not spec.pool or kind is None or not kinds.enabled(environ):
            return spec
        if spec.python not in ("", sys.executable):
            return spec
        try:
            socket_path = client.ensure(kind, environ)
        except OSError as exc:
            log.warning("no warm pool: %s", exc)
            return spec
        return dataclasses.replace(spec, pool_socket=socket_path)

    @classmethod
    def isolate(cls) -> str | None:
        return private_network()

    def place(self, n: int) -> list[Slot]:
        return [
            Slot(host="localhost", address="127.0.0.1", index=i, local_index=i) for i in range(n)
        ]

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        env = {**os.environ, **thread_env(self.spec.cpu), **self.spec.env, **proc.env}
        devices = self._gpus.take(proc.id)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        cpus = cpu_set(proc.slot.index, self.spec.cpu) if proc.slot is not None else None
        cwd = self.spec.workdir if os.path.isdir(self.spec.workdir) else None
        launch = _Launch(proc, env, cwd, cpus, log_path)
        handle = self._from_pool(launch) or self._start_cold(launch)
        if self.spec.cpu is not None and self.spec.cpu % 1:
            quota = CpuQuota(f"{self.job.id}-{proc.id}", self.spec.cpu)
            quota.add(handle.pid)
            self._quotas.append(quota)
        handle.gpus = devices or []
        return handle

    def _start_cold(self, launch: _Launch) -> LaunchedProcess:
        cpus = launch.cpus

        def preexec() -> None:
            die_with_parent()
            if cpus:
                os.sched_setaffinity(0, cpus)

        with open(launch.log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                launch.proc.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=launch.cwd,
                env=launch.env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self._started.add(popen.pid)
        return LocalProcess(popen)

    def _from_pool(self, launch: _Launch) -> LaunchedProcess | None:
        """A warm process from the job's pool, for a worker bootstrap; None: start cold."""
        argv = launch.proc.argv
        if not self.spec.pool_socket or argv[1:3] != ["-m", WORKER_MODULE]:
            return None
        from ..pool import client, kinds

        self._pooled_ids.add(launch.proc.id)
        self._pool_env = launch.env
        return client.claim(
            self.spec.pool_socket,
            {
                "argv": argv,
                "env": launch.env,
                "cwd": launch.cwd or os.getcwd(),
                "log": str(launch.log_path),
                "cpus": sorted(launch.cpus) if launch.cpus else None,
                "job": str(self.job.path),
                "per_job": kinds.per_job_names(self.spec.env),
            },
        )

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        try:
            return AdoptedProcess(pid)
        except psutil.NoSuchProcess:
            return None

    @classmethod
    def stop_lost(cls, status: JobStatus) -> list[int]:
        stopped = []
        for row in [*status.processes, *status.helpers]:
            process = same_process(row.pid, row.create_time)
            if process is not None:
                signal_tree(process, signal.SIGKILL)
                stopped.append(process.pid)
        return stopped

    def sweep(self) -> None:
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self.reap()

    def reap(self) -> None:
        for child in psutil.Process().children():
            if child.pid in self._started:
                continue  # left to its Popen object
            with contextlib.suppress(ChildProcessError, psutil.NoSuchProcess):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)

    def close(self) -> None:
        for quota in self._quotas:
            quota.close()
        if self._pooled_ids and self._pool_env is not None:
            from ..pool import client, kinds

            # the next run of the same cell finds its processes imported and waiting
            per_job = kinds.per_job_names(self.spec.env)
            count = len(self._pooled_ids)
            client.want(self.spec.pool_socket, count, self._pool_env, per_job)
