"""Slurm launcher: the job's processes as the tasks of one Slurm step per generation.

At submit, in the notebook, the request is checked with Slurm's own answer
(:func:`.cluster.preflight`: ``sinfo``, ``sbatch --test-only``): an impossible request
is one line, and nothing is submitted.

In the supervisor, each generation gets an allocation (``salloc --no-shell`` with the
job's request: one task per slot; the notebook's own when it runs inside one,
``SLURM_JOB_ID``): while Slurm holds it pending, its reason is a progress line of the
job's (and ``--timeout`` counts from the allocation's start); ``--queue-timeout``
cancels one that waits too long. Then one ``srun`` step runs :mod:`.task` once per slot
(:class:`.step.Step`): each task says where it is (node, address, interface, free
ports), receives the job's files into a private directory on its node, and runs its
process under the host agent (:mod:`..agent.host`) exactly as the ssh and Ray
launchers do: pid, memory, exit code, signals, the whole process tree killed when it
is hung up on. Each process's output comes back through srun into its log here, live.

The workers reach the supervisor's control and metrics channels over TCP, on the
address this machine has towards the partition's nodes only
(:meth:`SlurmKind.channel_host`); both are signed with the job's secret, which
each process is handed in memory (never in a file on a node).

At the end (stop, interrupt, a failed task, the job's end) every agent is hung up on,
what the job produced is brought back (its result, checkpoints), the step ends, and
the allocation this launcher asked for is cancelled (``scancel``) and waited for until
it has left the queue: nothing of the job is left on any node.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import getpass
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...contract.launch import GPUS, MPIRUN, LaunchedProcess, ProcessSpec, Slot
from ...contract.process import Env
from ...contract.spec import JobSpec, SpecError
from ...contract.store import JobDir
from ..agent.client import (
    HANG_UP_SECONDS,
    handoff_of,
    job_files_archive,
    live_job_ids,
    notebook_id,
    other_version,
)
from ..agent.delivery import PulledStream, result_slots
from ..agent.host import PROTOCOL
from ..base import Launcher, LauncherKind, LauncherOption, in_range, matching
from ..limits import thread_env
from ..remote.bring_back import Holder, bring_back
from .cluster import (
    Allocation,
    SlurmError,
    preflight,
    remove_on_nodes,
    request_options,
    slurm,
)
from .step import SlurmProcess, Step
from .task import ALL, FILES, REMOVE, SEND, SWEEP

log = logging.getLogger(__name__)

ROOT = ".jupyter_distrain/slurm"  # under the node's HOME: JOB/task<N> per task
# what a task takes of the kernel's environment (about what an ssh session has): the rest
# of it (a JUPYTERHUB_API_TOKEN, cloud keys) stays here; the job's --env travels with it
STEP_EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SLURM_CONF")
PORTS_PER_TASK = 3  # free ports each task reports (servers the backends run on it)
SEND_SECONDS = 60.0  # the longest a task may be silent while it sends its results back


NAME = r"^[A-Za-z0-9_.-]{1,64}$"  # an account's or a QOS's


def _own(
    key: str,
    kind: type,
    default: Any,
    help: str,
    check: Callable[[str, Any], None] | None = None,
    flag: str = "",
) -> LauncherOption:
    """One of this launcher's own options: ``slurm_KEY``, the flag ``--KEY`` (dashes)."""
    return LauncherOption(
        f"slurm_{key}",
        kind,
        default,
        f"slurm launcher: {help}",
        flag=flag or "--" + key.replace("_", "-"),
        check=check,
        only_for="the Slurm launcher",
    )


def job_name(job_id: str) -> str:
    """The Slurm job (and step) name of a job's allocations."""
    return f"jupyter_distrain-{job_id}"


def _not_negative(flag: str, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise SpecError(f"{flag} must be seconds >= 0, got {value!r}")


SLURM_OPTIONS = (
    _own(
        "partition",
        str,
        "",
        "the partition (default: Slurm's default one)",
        matching(r"^[A-Za-z0-9_.,-]{1,64}$", "a partition name (or names, with commas)"),
    ),
    _own(
        "time",
        str,
        "",
        "the allocation's time limit (Slurm's format: 30, 1:00:00, 1-0)",
        matching(r"^[0-9:-]{1,16}$", "a Slurm time limit (minutes, [D-]HH:MM:SS)"),
    ),
    _own("account", str, "", "the account to charge", matching(NAME, "an account name")),
    _own("qos", str, "", "the quality of service", matching(NAME, "a QOS name")),
    _own(
        "nodes",
        int,
        0,
        "how many nodes the tasks spread over (default: Slurm's choice)",
        in_range(0, 100_000, "a number of nodes >= 0"),
    ),
    _own(
        "options",
        str,
        "",
        "more sbatch options for the allocation, as one string",
        flag="--sbatch-options",
    ),
    _own(
        "queue_timeout",
        float,
        0.0,
        "seconds the allocation may wait in Slurm's queue, then it is cancelled "
        "(default 0: no limit)",
        _not_negative,
    ),
    LauncherOption("remote_python", str, "", "ssh, slurm launchers: the interpreter on the hosts"),
)


class SlurmKind(LauncherKind):
    """What the Slurm launcher is and checks at submit: its options and capabilities, the
    cluster's pre-flight, its channels' address, and the allocation a lost supervisor
    held."""

    name = "slurm"
    declared_options = SLURM_OPTIONS
    supports = frozenset({GPUS})
    why_not = {MPIRUN: " yet (use Gloo)"}

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        found = preflight(spec, cls.option_values(spec), processes)
        return dataclasses.replace(spec, placement=[found])

    @classmethod
    def notes(cls, spec: JobSpec) -> list[str]:
        cluster = spec.placement[0] if spec.placement else {}
        where = f"partition {cluster.get('partition') or '(default)'}"
        if cluster.get("allocation"):
            where = f"this notebook's allocation {cluster['allocation']}"
        return [f"Slurm: {where}, nodes {', '.join(cluster.get('nodes', []))}"]

    @classmethod
    def isolate(cls) -> str | None:
        return "the slurm launcher runs the job on the Slurm cluster's nodes"

    @classmethod
    def runs_on_other_hosts(cls, spec: JobSpec) -> bool:
        return True

    @classmethod
    def channel_host(cls, spec: JobSpec) -> str | None:
        cluster = spec.placement[0] if spec.placement else {}
        return cluster.get("driver", "127.0.0.1")

    @classmethod
    def release_lost(cls, job: JobDir) -> None:
        """Cancel the allocations a lost supervisor asked for (its salloc is killed with
        it, before it could give them up): this user's Slurm jobs named for the job; each
        first runs a step that removes the job's directories on its nodes (the warden
        killed srun, so the tasks may not have)."""
        mine = (f"--name={job_name(job.id)}", f"--user={getpass.getuser()}")
        try:
            for slurm_job in slurm("squeue", "--noheader", "--format=%i", *mine).split():
                remove_on_nodes(slurm_job, f"{ROOT}/{job.id}")
        except SlurmError as exc:
            log.warning("the job's directories on the nodes may stay: %s", exc)
        with contextlib.suppress(SlurmError):
            slurm("scancel", *mine)


class SlurmLauncher(Launcher):
    """Runs each generation as one step of a Slurm allocation (see the module docstring)."""

    kind = SlurmKind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options = self.kind.option_values(self.spec)
        self.cluster: dict[str, Any] = self.spec.placement[0] if self.spec.placement else {}
        self.allocation: Allocation | None = None
        self.step: Step | None = None
        self.slots: list[Slot] = []
        self.hostnames: list[str] = []
        self.directories: list[str] = []  # each task's, on its node
        self._free_ports: dict[str, list[int]] = {}
        self._processes: list[SlurmProcess] = []
        self._result_slots: set[int] = set()
        self._handoff: dict[str, str] = {}

    # --- at submit -----------------------------------------------------------------------
    def driver_address(self) -> str:
        return self.kind.channel_host(self.spec) or "127.0.0.1"

    # --- placing ---------------------------------------------------------------------------
    def place(self, n: int) -> list[Slot]:
        if self.cluster.get("allocation"):
            self.allocation = Allocation(self.cluster["allocation"], owned=False)
        else:
            wanted = request_options(self.spec, self.options, n)
            wanted.append(f"--job-name={job_name(self.job.id)}")
            queue_limit = self.options["slurm_queue_timeout"]
            self.allocation = Allocation.request(wanted, self.progress, queue_limit)
            self.job.append_event(
                "allocation", slurm_job=self.allocation.job_id, queued=self.allocation.waited
            )
        self.step = Step(self._srun_argv(n), n, self._step_env(), self.allocation.describe_end)
        described = self.step.describe(self.spec.timeout)
        for info in described:
            if info.get("protocol") != PROTOCOL:
                raise RuntimeError(other_version(f"Slurm node {info['hostname']}", info))
        seen: Counter[str] = Counter()
        for index, info in enumerate(described):
            address = info["address"]
            self.slots.append(Slot(address, address, index, seen[address], info["iface"]))
            self.hostnames.append(info["hostname"])
            self.directories.append(info["directory"])
            pool = self._free_ports.setdefault(address, [])
            pool.extend(p for p in info["ports"] if p not in pool)
            seen[address] += 1
        root = self.job.path.parent
        claims = {"notebook": notebook_id(root), "live": live_job_ids(root)}
        self.step.send(ALL, SWEEP, json.dumps(claims).encode())
        files = base64.b64encode(job_files_archive(self.job.path, in_memory=True))
        self.step.send(ALL, FILES, files)
        self._handoff = handoff_of(self.job.path)
        log.info(
            "Slurm job %s: step of %d tasks on %s",
            self.allocation.job_id,
            n,
            dict(Counter(self.hostnames)),
        )
        return self.slots

    def _step_name(self) -> str:
        return job_name(self.job.id)

    def _srun_argv(self, n: int) -> list[str]:
        assert self.allocation is not None
        python = self.options["remote_python"] or self.spec.python or sys.executable
        argv = [
            "srun",
            f"--jobid={self.allocation.job_id}",
            f"--job-name={self._step_name()}",
            f"--ntasks={n}",
            "--label",
            "--input=all",
            "--kill-on-bad-exit=0",
            "--quiet",
        ]
        if self.spec.cpu:
            argv.append(f"--cpus-per-task={math.ceil(self.spec.cpu)}")
        if self.spec.gpus:
            argv.append(f"--gpus-per-task={self.spec.gpus}")
        if not self.allocation.owned:
            argv.append("--overlap")  # beside the notebook's own step in its allocation
            if self.spec.left_out:  # lost nodes of it a restart goes without
                argv.append(f"--exclude={','.join(self.spec.left_out)}")
        exported = [name for name in STEP_EXPORTED if name in os.environ]
        argv.append("--export=" + (",".join(exported) or "NONE"))
        task = [python, "-m", "jupyter_distrain.launchers.slurm.task"]
        return [*argv, *task, f"~/{ROOT}/{self.job.id}", self.driver_address(), str(PORTS_PER_TASK)]

    @staticmethod
    def _step_env() -> dict[str, str]:
        """srun's environment: this one without the job variables of an enclosing
        allocation's step (srun would take its task count and layout from them). What
        reaches the tasks of it is --export's (:data:`STEP_EXPORTED`)."""
        keep = ("SLURM_CONF",)
        return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k in keep}

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        try:
            return [self._free_ports[slot.address].pop(0) for slot in slots]
        except IndexError:
            raise RuntimeError("the Slurm tasks reported too few free ports") from None

    # --- processes -------------------------------------------------------------------------
    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        assert proc.slot is not None and self.step is not None, "placed first"
        index = proc.slot.index
        self._result_slots.update(slot.index for slot in result_slots(proc))
        env = {**thread_env(self.spec.cpu), **self.spec.env, **proc.env}
        env[Env.JOB_DIR] = self.directories[index]
        python = self.spec.python or sys.executable
        remote = self.options["remote_python"]
        argv = [remote if remote and arg == python else arg for arg in proc.argv]
        self.step.attach_log(index, log_path)
        request = {"argv": argv, "env": env, "handoff": self._handoff}
        handle = SlurmProcess(self.step, index, self.hostnames[index], request)
        self._processes.append(handle)
        return handle

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        return None  # every process of a Slurm job is started by this launcher

    def sweep(self) -> None:
        for handle in self._processes:
            handle.hang_up()
        deadline = time.monotonic() + HANG_UP_SECONDS
        for handle in self._processes:
            handle.agent.wait_ended(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Hang up, bring back what the job produced, end the step, release the allocation."""
        self.sweep()
        step, allocation = self.step, self.allocation
        lost = sorted({self.hostnames[i] for i in step.silent}) if step is not None else []
        if step is not None:
            if step.alive:
                self._bring_back(step)
            if not step.close_input(HANG_UP_SECONDS) and allocation is not None:
                allocation.cancel_step(self._step_name())
            step.kill()
        if allocation is not None:
            allocation.release(unreachable=bool(lost))
            if lost and allocation.owned:
                self.warn(
                    f"Slurm job {allocation.job_id} is cancelled; {', '.join(lost)} does not "
                    "answer: Slurm ends it there once the node is back or marked DOWN"
                )
        self.step = self.allocation = None

    def _bring_back(self, step: Step) -> None:
        """Each task's files, pieces it sends through the step, brought back; a task's
        directory on its node is removed once they are stored here."""
        holders = [
            Holder(
                f"task {index} on {self.hostnames[index]}",
                self.directories[index],
                slot.index in self._result_slots,
                functools.partial(_task_archive, step, index),
                functools.partial(step.send, index, REMOVE),
            )
            for index, slot in enumerate(self.slots)
        ]
        bring_back(self.job.path, holders, self.warn)


@contextlib.contextmanager
def _task_archive(step: Step, index: int) -> Iterator[PulledStream]:
    """Task ``index``'s archive: the pieces it sends through ``step`` once asked."""
    step.send(index, SEND)

    def fetch(size: int) -> bytes:
        piece = step.receive(index, SEND_SECONDS)
        if isinstance(piece, str):  # its end: "" when all of it came, else why not
            if piece:
                raise RuntimeError(piece)
            return b""
        return piece

    yield PulledStream(fetch)


__all__ = ["SlurmLauncher"]
