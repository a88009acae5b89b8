"""Slurm's own commands, as the Slurm launcher asks them: what a job requests
(:func:`request_options`), the pre-flight (:func:`preflight`: ``sinfo`` and
``sbatch --test-only``, nothing submitted), and an allocation (:class:`Allocation`:
``salloc`` holding it while the supervisor lives, its queue state while it waits,
``scancel``).

Every command finds the cluster as Slurm's commands always do (``SLURM_CONF``, or the
configuration Slurm was installed with); a failure is one line, Slurm's own last.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...contract.spec import JobSpec, SpecError
from ..agent.host import route_source
from ..base import LaunchCancelled

COMMAND_SECONDS = 30.0  # the longest one Slurm command may take
POLL_SECONDS = 2.0  # how often a pending job's state is asked
GONE_SECONDS = 30.0  # for a cancelled job to leave the queue
ASKED = re.compile(r"job allocation (\d+)")  # salloc's "Pending ..." or "Granted ..." line
GRANTED = re.compile(r"Granted job allocation (\d+)")
# What salloc runs here while the allocation lasts: a command that ends when its stdin
# does, which the supervisor holds. When the supervisor is gone, however it went, the
# command ends and salloc gives the allocation up: no allocation outlives its job.
HOLD = ("cat",)


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is one line."""


def last_line(text: str, otherwise: str) -> str:
    """The last non-empty line of ``text`` without Slurm's ``sbatch: error:`` prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return otherwise
    return re.sub(r"^\w+: (error: )?", "", lines[-1])


def slurm(*argv: str, timeout: float = COMMAND_SECONDS) -> str:
    """Run one Slurm command; its stdout, or :class:`SlurmError` with what it said."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g} s") from None
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here (Debian: slurm-client)") from None
    if done.returncode != 0:
        raise SlurmError(last_line(done.stderr or done.stdout, f"{argv[0]} failed"))
    return done.stdout


def request_options(spec: JobSpec, options: dict[str, Any], tasks: int) -> list[str]:
    """What the job asks Slurm for: ``tasks`` tasks (one per slot), each with ``--cpu``
    CPUs, ``--memory`` GiB and ``--gpus`` GPUs, on the launcher's partition, time, account,
    QOS and nodes, not on the nodes a restart left out, then the pass-through ``sbatch``
    options."""
    wanted = [f"--ntasks={tasks}"]
    cpus = math.ceil(spec.cpu) if spec.cpu else 1
    if spec.cpu:
        wanted.append(f"--cpus-per-task={cpus}")
    if spec.memory:
        wanted.append(f"--mem-per-cpu={math.ceil(spec.memory * 1024 / cpus)}M")
    if spec.gpus:
        wanted.append(f"--gpus-per-task={spec.gpus}")
    for key, flag in (
        ("slurm_partition", "--partition"),
        ("slurm_time", "--time"),
        ("slurm_account", "--account"),
        ("slurm_qos", "--qos"),
    ):
        if options[key]:
            wanted.append(f"{flag}={options[key]}")
    if options["slurm_nodes"]:  # less the lost nodes a restart goes without
        wanted.append(f"--nodes={max(1, options['slurm_nodes'] - len(spec.left_out))}")
    if spec.left_out:
        wanted.append(f"--exclude={','.join(spec.left_out)}")
    return wanted + shlex.split(options["slurm_options"])


def describe_request(spec: JobSpec, tasks: int) -> str:
    each = [f"{math.ceil(spec.cpu) if spec.cpu else 1} CPU"]
    if spec.memory:
        each.append(f"{spec.memory:g} GiB")
    if spec.gpus:
        each.append(f"{spec.gpus} GPU")
    return f"{tasks} task{'s' * (tasks != 1)} of {' + '.join(each)}"


def partition_nodes(partition: str) -> list[tuple[str, str, int]]:
    """The nodes (name, address, CPUs) of ``partition`` ("": the default one)."""
    argv = ["sinfo", "--noheader", "--Node", "--format=%N %o %c"]
    if partition:
        argv.append(f"--partition={partition}")
    nodes = []
    for line in slurm(*argv).splitlines():
        name, address, cpus = line.split()
        if (name, address, int(cpus)) not in nodes:  # a node of several partitions
            nodes.append((name, address, int(cpus)))
    return nodes


def preflight(spec: JobSpec, options: dict[str, Any], tasks: int) -> dict[str, Any]:
    """Check with Slurm, before anything is submitted, that the job's request can run
    (see the module docstring); what the supervisor needs: the address the nodes reach
    this machine on, the nodes, the allocation to use when the notebook runs in one."""
    if not shutil.which("srun") or not shutil.which("sbatch"):
        raise SpecError("--launcher slurm needs Slurm's commands here (Debian: slurm-client)")
    partition = options["slurm_partition"]
    where = f"partition {partition}" if partition else "the default partition"
    try:
        nodes = partition_nodes(partition)
        if not nodes:
            raise SlurmError("no such partition here, or it has no nodes")
        inside = os.environ.get("SLURM_JOB_ID", "")
        if not inside:
            argv = ["sbatch", "--test-only", *request_options(spec, options, tasks)]
            slurm(*argv, "--wrap", "true")
        driver = route_source(nodes[0][1])
    except SlurmError as exc:
        listed = ", ".join(f"{name} ({cpus} CPUs)" for name, _, cpus in nodes) if nodes else ""
        has = f" (it has {listed})" if listed else ""
        raise SpecError(
            f"--launcher slurm: {where}{has} cannot run {describe_request(spec, tasks)}: {exc}"
        ) from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"--launcher slurm: Slurm's answer could not be read: {exc}") from None
    return {
        "driver": driver,
        "nodes": [name for name, _, _ in nodes],
        "partition": partition,
        "allocation": inside,
    }


def steps_of(job_id: str) -> list[str]:
    """The running steps of Slurm job ``job_id`` (``JOB.STEP`` each)."""
    out = slurm("squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i")
    return out.split()


def remove_on_nodes(job_id: str, path: str) -> None:
    """End Slurm job ``job_id``'s steps (and wait until they have ended), then remove
    ``path`` (under the home directory) on every node of the job with one more step (a
    task per node); :class:`SlurmError` if that fails."""
    for step in steps_of(job_id):
        with contextlib.suppress(SlurmError):  # it ended meanwhile
            slurm("scancel", "--signal=KILL", step)
    deadline = time.monotonic() + GONE_SECONDS
    while steps_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    slurm(
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--ntasks-per-node=1",
        "--quiet",
        "sh",
        "-c",
        'rm -rf -- "$HOME/$0"',
        path,
    )


def queue_state(job_id: str) -> tuple[str, str]:
    """A job's state and Slurm's reason for it; ("", "") once it has left the queue."""
    try:
        out = slurm("squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%r")
    except SlurmError:  # an unknown job id: it ended and was purged
        return "", ""
    state, _, reason = out.strip().partition("|")
    return state, reason


@dataclass
class Allocation:
    """The Slurm job whose nodes a generation runs on; ``owned``: this launcher asked for
    it (and cancels it at the end), else the notebook's own."""

    job_id: str
    owned: bool
    waited: float = 0.0  # seconds it was pending
    said: list[str] = field(default_factory=list)  # what salloc said
    salloc: subprocess.Popen[str] | None = None

    @classmethod
    def request(
        cls,
        wanted: list[str],
        progress: Callable[[str], bool],
        queue_limit: float,
    ) -> Allocation:
        """An allocation for ``wanted`` (see :data:`HOLD`); while Slurm holds it pending,
        each new reason is a ``progress`` line (False: stop asked, the job is cancelled and
        :class:`LaunchCancelled` raised); after ``queue_limit`` seconds pending (0: no
        limit) it is cancelled, and :class:`SlurmError` says so."""
        made = cls("", owned=True)
        made.salloc = subprocess.Popen(
            ["salloc", *wanted, *HOLD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=made._read, daemon=True).start()
        started = time.monotonic()
        shown = ("", "")
        try:
            while not made._said(GRANTED):
                if made.salloc.poll() is not None:
                    said = last_line("\n".join(made.said), "no allocation")
                    raise SlurmError(f"salloc: {said}")
                made.job_id = made.job_id or made._said(ASKED)
                time.sleep(POLL_SECONDS if made.job_id else 0.05)
                if not made.job_id or made._said(GRANTED):
                    continue
                state, reason = queue_state(made.job_id)
                made.waited = time.monotonic() - started
                line = ""
                if state == "PENDING" and (state, reason) != shown:
                    shown = (state, reason)
                    line = f"pending in Slurm queue: {reason} (job {made.job_id})"
                if not progress(line):
                    raise LaunchCancelled(f"stopped while Slurm job {made.job_id} was pending")
                if queue_limit and state == "PENDING" and made.waited > queue_limit:
                    raise SlurmError(
                        f"Slurm job {made.job_id} was still pending ({reason}) after "
                        f"{queue_limit:g} s (--queue-timeout): cancelled"
                    )
        except BaseException:
            made.job_id = made.job_id or made._said(ASKED)
            made.release()
            raise
        made.job_id = made._said(GRANTED)
        if shown != ("", ""):
            progress(f"Slurm job {made.job_id} started after {made.waited:.0f} s in the queue")
        return made

    def _read(self) -> None:
        assert self.salloc is not None and self.salloc.stdout is not None
        for line in self.salloc.stdout:
            self.said.append(line.strip())

    def _said(self, pattern: re.Pattern[str]) -> str:
        """The job id in the first line of salloc's that matches ``pattern`` ("": none)."""
        for line in list(self.said):
            found = pattern.search(line)
            if found:
                return found[1]
        return ""

    def release(self, unreachable: bool = False) -> None:
        """End the job (when it is this launcher's: its salloc's hold ends, and it is
        cancelled) and wait until it has left the queue: every step and process of it
        ended on every node. With ``unreachable`` (a node of it is lost), only until it
        is COMPLETING: Slurm finishes it there once the node is back or marked DOWN."""
        if not self.owned:
            return
        if self.salloc is not None:
            with contextlib.suppress(OSError):
                assert self.salloc.stdin is not None
                self.salloc.stdin.close()  # the hold ends: salloc gives the allocation up
        if self.job_id:
            with contextlib.suppress(SlurmError):
                slurm("scancel", self.job_id)
            deadline = time.monotonic() + GONE_SECONDS
            while time.monotonic() < deadline:
                state = queue_state(self.job_id)[0]
                if not state or (unreachable and state == "COMPLETING"):
                    break
                time.sleep(0.2)
        if self.salloc is not None:
            try:
                self.salloc.wait(COMMAND_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.salloc.pid, signal.SIGKILL)
                self.salloc.wait()
            self.salloc = None

    def describe_end(self) -> str:
        """What Slurm says of this job now, for a process lost with it ("" while it runs):
        its state (COMPLETING, CANCELLED, NODE_FAIL, TIMEOUT) and reason."""
        try:
            shown = slurm("scontrol", "--oneliner", "show", "job", self.job_id)
        except SlurmError:
            return ""
        fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
        state, reason = fields.get("JobState", ""), fields.get("Reason", "None")
        if not state or state == "RUNNING":
            return ""
        because = f" ({reason})" if reason != "None" else ""
        return f"Slurm job {self.job_id} is {state}{because}"

    def cancel_step(self, name: str) -> None:
        """Cancel this job's step named ``name`` (the notebook's own allocation stays)."""
        with contextlib.suppress(SlurmError):
            out = slurm(
                "squeue", "--noheader", "--steps", f"--jobs={self.job_id}", "--format=%i %j"
            )
            for line in out.splitlines():
                step, _, step_name = line.partition(" ")
                if step_name.strip() == name:
                    slurm("scancel", step)
