"""Local launcher: every process on this machine, in its own session, dying with the supervisor.

Design decision
---------------

- **Logs go straight from the worker to its file.** The launcher opens
  `logs/<role>-<index>.log` and passes it as the process's stdout and stderr,
  with `PYTHONUNBUFFERED=1`. Nothing sits between the worker and the disk, so
  no line is lost if the supervisor or the kernel dies. The cell streams output
  by tailing those files (`follow.LogTail`, one `tail.LineReader` per log) and
  prefixes each line with `[rank]`. Under `mpirun` one process hosts every
  rank, so the bootstrap `dup2`s its own fds onto `logs/worker-<rank>.log`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from ..contract import box
from ..contract.launch import LaunchedProcess, ProcessSpec, Slot
from ..contract.process import Env, ProcessId
from ..contract.spec import JobSpec, SpecError
from ..contract.status import JobStatus
from ..pool import client as pool_client
from ..pool import kinds as pool_kinds
from ..processes import (
    become_subreaper,
    die_with_parent,
    kill_descendants,
    reap_zombies,
    same_process,
    signal_tree,
)
from . import gpus
from .base import Launcher, LauncherKind
from .handles import AdoptedProcess, LocalProcess, PooledProcess
from .isolation import namespace_refused, private_network
from .limits import CpuQuota, cpu_set, thread_env

log = logging.getLogger(__name__)

PROCESSES_PER_CORE = 4  # oversubscription a local job may ask for
SMALL_SHARED_MEMORY = 2**30  # below this, DataLoader workers run out (Docker's default: 64 MiB)
MIN_PROCESS_LIMIT = 8


@dataclasses.dataclass(frozen=True)
class _Launch:
    """Everything one process is started with, cold or from the pool."""

    proc: ProcessSpec
    env: dict[str, str]
    cwd: str | None
    cpus: set[int] | None
    log_path: Path


class LocalKind(LauncherKind):
    """What the local launcher is and checks at submit: this machine's capacity, its warm
    pool, its isolation, the processes a lost supervisor left."""

    name = "local"

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        cores = box.cpus()
        given = os.environ.get(Env.LOCAL_PROCESS_LIMIT, "")
        limit = max(MIN_PROCESS_LIMIT, PROCESSES_PER_CORE * int(cores.amount))
        limit = int(given) if given.isdigit() else limit
        what = f"--workers {spec.workers}" + (f" --ps {spec.ps}" if spec.ps else "")
        here = f"{cores.amount:g} CPUs: {cores.source}"
        if processes > limit:
            raise SpecError(
                f"{what}: the job needs {processes} processes; this machine runs at most "
                f"{limit} for one job ({here})"
            )
        # cores may be shared (the seed's cpu=0.5 on a laptop), within the same bound
        if spec.cpu is not None and spec.cpu * processes > PROCESSES_PER_CORE * cores.amount:
            raise SpecError(
                f"--cpu {spec.cpu:g}: {processes} processes need {spec.cpu * processes:g} "
                f"CPUs; this machine gives {here} (at most {PROCESSES_PER_CORE}x shared)"
            )
        memory = box.memory()
        if spec.memory is not None and spec.memory * processes * 2**30 > memory.amount:
            raise SpecError(
                f"--memory {spec.memory:g}: {processes} processes need "
                f"{spec.memory * processes:g} GiB; this machine gives "
                f"{memory.amount / 2**30:.1f} GiB ({memory.source})"
            )
        devices = gpus.choose(spec, processes, gpus.discover() if spec.gpus else [])
        return dataclasses.replace(spec, gpu_ids=devices)

    @classmethod
    def choose_pool(cls, spec: JobSpec, environ: dict[str, str]) -> JobSpec:
        kind = pool_kinds.KIND_OF_BACKEND.get(spec.backend)
        if not spec.pool or kind is None or not pool_kinds.enabled(environ):
            return spec
        if spec.python not in ("", sys.executable):
            return spec
        try:
            socket_path = pool_client.ensure(kind, environ)
        except OSError as exc:
            log.warning("no warm pool: %s", exc)
            return spec
        if socket_path is None:
            return spec  # that pool is off here (its keeper said why, once)
        return dataclasses.replace(spec, pool_socket=socket_path)

    @classmethod
    def isolate(cls) -> str | None:
        return private_network()

    @classmethod
    def reachable_by(cls, spec: JobSpec) -> str:
        return "other users of this machine (and other hosts, for a server on every interface)"

    @classmethod
    def doctor(cls) -> list[str]:
        cores, memory, shared = box.cpus(), box.memory(), box.shared_memory()
        seen = os.cpu_count() or 0
        lines = [f"CPUs: {cores.amount:g} ({cores.source})"]
        if seen > cores.amount:
            lines[0] += (
                f"; the machine shows {seen}: a library that sizes its threads by that "
                "oversubscribes this box (jobs here share these CPUs among their ranks)"
            )
        lines.append(f"memory: {memory.amount / 2**30:.1f} GiB ({memory.source})")
        line = f"shared memory: {shared.amount / 2**20:.0f} MiB ({shared.source})"
        if shared.amount < SMALL_SHARED_MEMORY:
            line += (
                ": a torch DataLoader with workers may die of a bus error here: ask for a "
                "larger /dev/shm (docker --shm-size) or use torch.multiprocessing."
                "set_sharing_strategy('file_system')"
            )
        lines.append(line)
        refused = namespace_refused()
        lines.append(
            "network: each job in a private network namespace (nothing it serves is "
            "reachable from elsewhere)"
            if refused is None
            else f"network: {refused}: what a job serves is reachable by "
            f"{cls.reachable_by(JobSpec())} (each job says which ports)"
        )
        devices = gpus.discover()
        lines.append(f"GPUs: {', '.join(devices)}" if devices else "GPUs: none seen here")
        return lines

    @classmethod
    def stop_lost(cls, status: JobStatus) -> list[int]:
        stopped = []
        for row in [*status.processes, *status.helpers]:
            process = same_process(row.pid, row.create_time)
            if process is not None:
                signal_tree(process, signal.SIGKILL)
                stopped.append(process.pid)
        return stopped


class LocalLauncher(Launcher):
    """Runs every process on this machine, with CPU affinity/quota from ``--cpu``.

    The supervisor becomes a child subreaper, so orphans of the job's processes
    (ranks whose mpirun died, a grandchild that ``setsid``s) become its children:
    :meth:`sweep` kills them and :meth:`reap` collects them.
    """

    kind = LocalKind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._quotas: list[CpuQuota] = []
        self._gpus = gpus.GpuAllocator(self.spec)
        self._started: set[int] = set()
        self._pooled_ids: set[ProcessId] = set()  # processes that could come from the pool
        self._pool_env: dict[str, str] | None = None
        self._pool_presence: socket.socket | None = None  # open while the job runs
        self._said_cold: set[str] = set()  # why a claim started cold, said once
        become_subreaper()

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
        if not self.spec.pool_socket or argv[1:3] != ["-m", pool_kinds.WORKER_MODULE]:
            return None
        self._pooled_ids.add(launch.proc.id)
        self._pool_env = launch.env
        if self._pool_presence is None:
            self._pool_presence = pool_client.announce(self.spec.pool_socket, str(self.job.path))
        claimed = pool_client.claim(
            self.spec.pool_socket,
            {
                "argv": argv,
                "env": launch.env,
                "cwd": launch.cwd or os.getcwd(),
                "log": str(launch.log_path),
                "cpus": sorted(launch.cpus) if launch.cpus else None,
                "job": str(self.job.path),
                "run": self.run_id,
                "ahead": pool_kinds.plans_ahead(launch.env),
            },
        )
        if isinstance(claimed, str) and claimed.startswith(pool_kinds.ENV_DIFFERS):
            self._say_cold(claimed)
        return PooledProcess.of(claimed)

    def _say_cold(self, why: str) -> None:
        """Once a run: it starts cold because the kernel's or the job's environment
        changed what its libraries read at import (the pool now makes processes with it)."""
        if why not in self._said_cold:
            self._said_cold.add(why)
            self.warn(f"started cold: {why} (the pool now imports with this job's)")

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        """One of mpirun's ranks: only a descendant of a process this launcher started
        (a hello naming any other pid would have the job signal a stranger)."""
        try:
            if not any(p.pid in self._started for p in psutil.Process(pid).parents()):
                log.warning("process %d is not one this job started: not adopted", pid)
                return None
            return AdoptedProcess(pid)
        except psutil.NoSuchProcess:
            return None

    def sweep(self) -> None:
        kill_descendants()
        self.reap()

    def reap(self) -> None:
        reap_zombies(keep=self._started)  # those are left to their Popen objects

    def expect(self, workers: int) -> None:
        self._want_from_pool(len(self._pooled_ids) - self.spec.workers + workers)

    def _want_from_pool(self, count: int) -> None:
        """Ask the job's pool to keep ``count`` processes like this job's ready."""
        if self._pooled_ids and self._pool_env is not None:
            pool_client.want(self.spec.pool_socket, count, self._pool_env)

    def close(self) -> None:
        for quota in self._quotas:
            quota.close()
        # the next run of the same cell finds its processes imported and waiting
        self._want_from_pool(len(self._pooled_ids))
        if self._pool_presence is not None:
            self._pool_presence.close()
            self._pool_presence = None
