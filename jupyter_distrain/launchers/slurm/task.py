"""What each task of the Slurm launcher's step runs on its node:
``python -m jupyter_distrain.launchers.slurm.task ROOT DRIVER PORTS``.

One step (``srun --label --input=all``) runs one of these per slot. They all read the
same stdin (srun hands each task a copy of what the supervisor writes), so every line
names whom it is for: ``TARGET KIND [PAYLOAD]``, ``TARGET`` a task's number
(``SLURM_PROCID``) or ``*`` for all:

- ``sweep JSON``: ``{"notebook": ID, "live": [JOB, ...]}``: this task's directory will
  be marked as that notebook's, and the directories that notebook's other jobs left on
  this node (a job whose supervisor was killed with the tasks, or whose node was lost)
  are removed with any process of theirs still running here, unless the job is live;
- ``files B64``: the job's files (a tar, :func:`..agent.client.job_files_archive`),
  extracted into this task's private directory ``ROOT/task<N>`` (0700);
- ``agent LINE``: a line for the host agent (:mod:`..agent.host`), which the first
  such line (the process's request) starts with ``run`` in that directory: the agent
  then runs and watches the process exactly as for the ssh and Ray launchers (pid,
  memory, exit code, signals, the whole tree killed when it is hung up on);
- ``hangup``: close the agent's stdin (it kills what is left of its process tree);
- ``send``: the directory's results (:func:`..agent.files.pack`) as marked lines;
- ``remove``: remove the directory.

What this program says goes to stderr as the agent's marked lines (:func:`..agent.host.report`):
first where the task is (``describe``: host name, its directory, the address on the way to
``DRIVER``, its interface, ``PORTS`` free ports there, the package's version and
agent protocol), :data:`AGENT_END` once the agent has ended, last :data:`END`. The
agent's process writes to this task's stdout, which srun carries back to the
notebook's machine labelled with the task's number.
When stdin ends (srun, or the supervisor, is gone) the agent is hung up on and this
program ends: nothing outlives the step. Its directory goes too, unless it was asked to
send its results and then not told to remove them (they did not all come back: the
launcher says where they stay).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from ... import processes
from ..agent import files as agent_files
from ..agent import host as agent_host

ALL = "*"
FILES, AGENT, HANG_UP, SEND, REMOVE = "files", "agent", "hangup", "send", "remove"
SWEEP = "sweep"
DESCRIBE, CHUNK, SENT, AGENT_END, END = "describe", "chunk", "sent", "agent_end", "task_end"
SEND_BYTES = 48 * 1024  # raw bytes per ``chunk`` line (base64 makes them a third longer)
HANG_UP_SECONDS = 5.0  # for the agent to end once hung up on
# Slurm's variables a job's process keeps (which job and cluster it is in); the others
# describe this step's task layout, which frameworks would take for the job's own
# (Lightning's SLURMEnvironment, OpenMPI's singletons): the job's ranks are the plan's
SLURM_KEPT = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CLUSTER_NAME", "SLURM_CONF")


def agent_env() -> dict[str, str]:
    """This task's environment without Slurm's task layout (:data:`SLURM_KEPT` stay)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLURM_", "SLURMD_")) or key in SLURM_KEPT
    }


class Chunks:
    """A write-only stream that reports what is written as base64 ``chunk`` lines."""

    def __init__(self) -> None:
        self.pending = b""

    def write(self, data: bytes) -> int:
        self.pending += data
        while len(self.pending) >= SEND_BYTES:
            self._emit(self.pending[:SEND_BYTES])
            self.pending = self.pending[SEND_BYTES:]
        return len(data)

    def flush(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = b""

    @staticmethod
    def _emit(data: bytes) -> None:
        agent_host.report(**{CHUNK: base64.b64encode(data).decode()})


class Task:
    """This task: its directory and the agent it runs (see the module docstring)."""

    def __init__(self, root: Path, index: int):
        self.index = index
        self.directory = root / f"task{index}"
        self.agent: subprocess.Popen[bytes] | None = None
        self.watcher: threading.Thread | None = None
        self.sent = False  # asked to send its results back (then removed when told)
        self.owner = ""  # the notebook whose job this is (:data:`SWEEP`)

    def describe(self, driver: str, ports: int) -> None:
        here = agent_host.describe(agent_host.route_source(driver), ports)
        here.update(task=self.index, directory=str(self.directory))
        agent_host.report(**{DESCRIBE: here})

    def handle(self, kind: str, payload: bytes) -> None:
        """One command for this task."""
        if kind == SWEEP:
            claims = json.loads(payload)
            self.owner = str(claims["notebook"])
            self.sweep({str(job) for job in claims["live"]})
        elif kind == FILES:
            agent_files.make_private_dir(self.directory.parent.parent)
            agent_files.unpack(self.directory, base64.b64decode(payload), self.owner)
        elif kind == AGENT:
            self._to_agent(payload)
        elif kind == HANG_UP:
            self.hang_up()
        elif kind == SEND:
            self.sent = True
            self.hang_up()
            chunks = Chunks()
            try:
                agent_files.pack(self.directory, chunks)  # type: ignore[arg-type]
                chunks.flush()
                agent_host.report(**{SENT: ""})
            except OSError as exc:
                agent_host.report(**{SENT: f"{type(exc).__name__}: {exc}"})
        elif kind == REMOVE:
            agent_files.remove(self.directory)

    def sweep(self, live: set[str]) -> None:
        """Remove the task directories this task's notebook left here for jobs not in
        ``live`` (and kill what of theirs still runs on this node). Those of other
        notebooks, or not marked, stay; the tasks of a step may race: what one removed
        the others skip."""
        if not self.owner:
            return
        try:
            jobs = sorted(self.directory.parent.parent.iterdir())
        except OSError:
            return
        for job in jobs:
            if job.name in live or job == self.directory.parent or job.is_symlink():
                continue
            with contextlib.suppress(OSError):
                for task in sorted(job.iterdir()):
                    if agent_files.owner_of(task) == self.owner:
                        agent_host.kill_job_processes(task)
                        agent_files.remove(task)

    def _to_agent(self, line: bytes) -> None:
        if self.agent is None:
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "jupyter_distrain.launchers.agent", "run"]
                + [str(self.directory)],
                stdin=subprocess.PIPE,
                env=agent_env(),
            )
            self.watcher = threading.Thread(target=self._watch, args=(self.agent,), daemon=True)
            self.watcher.start()
        stdin: IO[bytes] | None = self.agent.stdin
        with contextlib.suppress(OSError, ValueError):
            assert stdin is not None
            stdin.write(line + b"\n")
            stdin.flush()

    def _watch(self, agent: subprocess.Popen[bytes]) -> None:
        """Say when the agent has ended (all its reports are written by then)."""
        agent.wait()
        agent_host.report(**{AGENT_END: self.index})

    def hang_up(self) -> None:
        """Close the agent's stdin and wait for it; kill its tree when it does not end."""
        if self.agent is None:
            return
        with contextlib.suppress(OSError):
            assert self.agent.stdin is not None
            self.agent.stdin.close()
        try:
            self.agent.wait(HANG_UP_SECONDS)
        except subprocess.TimeoutExpired:  # our child, not yet reaped: its pid is its own
            import psutil

            with contextlib.suppress(psutil.NoSuchProcess):
                processes.signal_tree(psutil.Process(self.agent.pid), signal.SIGKILL)
            self.agent.wait()
        if self.watcher is not None:
            self.watcher.join()  # its line is out before anything else is said


def serve(task: Task, commands: IO[bytes]) -> None:
    """Take this task's commands from ``commands`` until it ends."""
    mine = (ALL.encode(), str(task.index).encode())
    for raw in commands:
        target, _, rest = raw.rstrip(b"\n").partition(b" ")
        if target not in mine:
            continue
        kind, _, payload = rest.partition(b" ")
        task.handle(kind.decode(), payload)


def _ended_by_slurm(number: int, _frame: object) -> None:
    """Slurm ends the step (scancel, the time limit): clean up on the way out."""
    raise SystemExit(128 + number)


def main(argv: list[str]) -> int:
    root, driver, ports = Path(argv[0]).expanduser(), argv[1], int(argv[2])
    task = Task(root, int(os.environ["SLURM_PROCID"]))
    signal.signal(signal.SIGTERM, _ended_by_slurm)
    processes.become_subreaper()  # what the agent leaves, if it dies first, comes to us
    try:
        task.describe(driver, ports)
        serve(task, sys.stdin.buffer)
    finally:
        task.hang_up()
        processes.kill_descendants()  # a process whose agent Slurm's SIGTERM ended first
        if not task.sent:  # the supervisor is gone before the end: nobody will fetch it
            agent_files.remove(task.directory)
        with contextlib.suppress(OSError):
            agent_host.report(**{END: task.index})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
