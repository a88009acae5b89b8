"""What the Ray launcher runs on a Ray node: one :class:`SlotAgent` actor per slot.

The actor keeps the slot's private directory (0700, under the node's HOME: never a
file system shared with the notebook's machine), filled from the object store with
the job's files. It runs its process under the remote agent
(``python -m jupyter_distrain.launchers.agent run``), as the ssh launcher does: the agent
starts the process in a new session, reports its pid, memory and exit code, and
kills the whole process tree when its stdin ends or the actor's pings stop. The
actor holds that stdin, so when the actor dies (its owner, the supervisor, is gone,
or it was killed) nothing it started outlives it.

The agent is detached from the actor (:data:`DETACH`: it is not the actor's child):
when an actor's worker exits, Ray SIGKILLs the worker's direct children
(``kill_child_processes_on_worker_exit``), which would kill the agent before it could
clean up and leave the process running as an orphan (seen here). Its output goes to a
log file here that the supervisor reads back piece by piece (:meth:`SlotAgent.pump`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ... import processes
from ...contract.process import Env
from ..agent import files as agent_files
from ..agent import host as agent_host
from ..agent.client import HANG_UP_SECONDS, AgentClient

ROOT = ".jupyter_distrain/ray"  # under the node's HOME
START_SECONDS = 30.0  # for the agent to report the process's pid
PUMP_BYTES = 1 << 20  # the most log bytes one pump returns
# Run argv[1:] as a grandchild in a session of its own; the intermediate exits at once.
DETACH = (
    "import os, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def agent_env() -> dict[str, str]:
    """This worker's environment without what Ray set for its own workers."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


class AgentLink:
    """One run of the remote agent, detached (see the module docstring): the request goes
    in on its stdin, its reports come back on its stderr (:attr:`agent`), its (the
    process's) output goes to ``log_path``."""

    def __init__(self, directory: Path, log_path: Path, request: dict[str, Any]):
        agent = [sys.executable, "-m", "jupyter_distrain.launchers.agent", "run", str(directory)]
        with open(log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-c", DETACH, *agent],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.PIPE,
                env=agent_env(),
            )
        popen.wait()  # the intermediate: the agent goes on, holding the pipes
        assert popen.stdin is not None and popen.stderr is not None
        self.agent = AgentClient(popen.stdin, popen.stderr, request)

    def hang_up(self) -> None:
        """Close the agent's stdin (it kills what is left of the process tree), wait;
        kill the process tree here if the agent does not end."""
        self.agent.hang_up()
        if not self.agent.wait_ended(HANG_UP_SECONDS) and self.agent.pid:
            processes.kill_tree(self.agent.pid, self.agent.create_time)
            self.agent.wait_ended(HANG_UP_SECONDS)


class SlotAgent:
    """A Ray actor for one slot of one job (see the module docstring)."""

    def __init__(self, job_id: str, slot: int):
        self.directory = Path.home() / ROOT / job_id / f"slot{slot}"
        self.link: AgentLink | None = None
        self.log_path: Path | None = None

    def describe(self) -> dict[str, Any]:
        """Where this slot is (the node's IP, the interface holding it, the host name) and
        the version of this package and of the agent's protocol there."""
        import ray

        return agent_host.describe(ray.util.get_node_ip_address())

    def unpack(self, data: bytes) -> str:
        """Make the slot's private directory and extract the job's files (a tar) in it."""
        agent_files.make_private_dir(self.directory.parent.parent)
        agent_files.unpack(self.directory, data)
        return str(self.directory)

    def free_ports(self, address: str, count: int) -> list[int]:
        return agent_host.free_ports(address, count)

    def start(self, request: dict[str, Any], name: str, python: str) -> dict[str, Any]:
        """Start the process described by ``request`` (argv, env, and ``pool`` when it
        may come from this node's warm pool) with its output in
        ``logs/<name>.log`` here; ``python``, the supervisor's interpreter, is replaced by
        this node's in argv. Returns its pid, start time and whether it was pooled."""
        if self.link is not None:
            raise RuntimeError("this slot already runs a process")
        argv = list(request["argv"])
        if argv and argv[0] == python:
            argv[0] = sys.executable
        env = {**request["env"], Env.JOB_DIR: str(self.directory)}
        self.log_path = self.directory / "logs" / f"{name}.log"
        handed = {"argv": argv, "env": env, "handoff": request["handoff"]}  # kept in memory
        if "pool" in request:  # from this node's warm pool (agent/pooled.py)
            handed["pool"] = request["pool"]
        self.link = AgentLink(self.directory, self.log_path, handed)
        agent = self.link.agent
        if not agent.wait_started(START_SECONDS):
            said = agent.said("no report from the agent")
            raise RuntimeError(f"the process did not start: {said}")
        return {"pid": agent.pid, "create_time": agent.create_time, "pooled": agent.pooled}

    def pump(self, offset: int) -> dict[str, Any]:
        """New output from ``offset`` on, the process's memory, and its exit code once it
        has exited and all its output has been read."""
        if self.link is None or self.log_path is None:
            raise RuntimeError("this slot runs no process")
        agent = self.link.agent
        ended = agent.ended()  # before reading: output written before the end is in
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            data = log_file.read(PUMP_BYTES)
        code = None
        if ended and len(data) < PUMP_BYTES:
            code = agent.outcome()
            if agent.exit_code is None:
                said = agent.said("no exit code")
                data += f"\njupyter_distrain: the agent on this node ended: {said}\n".encode()
        return {"data": data, "rss": agent.rss, "exit": code}

    def signal(self, sig: int, tree: bool) -> None:
        if self.link is not None:
            self.link.agent.signal(sig, tree)

    def receive_files(self, files: dict[str, bytes]) -> None:
        """A session's cell files, for the slot's directory (through the agent: written
        before a signal sent after them)."""
        if self.link is not None:
            for name, data in files.items():
                self.link.agent.send_file(name, data)

    def hang_up(self) -> None:
        """End the process and whatever it left behind."""
        if self.link is not None:
            self.link.hang_up()

    def send_open(self) -> None:
        """Start the agent's ``send`` for this slot: what the job produced here (its result,
        checkpoints), read back by :meth:`send_read`; the directory stays (:meth:`remove`)."""
        self.hang_up()
        self._send_errors = tempfile.TemporaryFile()  # noqa: SIM115  read by send_read
        agent = [sys.executable, "-m", "jupyter_distrain.launchers.agent", "send"]
        self._sender = subprocess.Popen(
            [*agent, str(self.directory)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._send_errors,
            env=agent_env(),
        )

    def send_read(self, size: int) -> bytes:
        """The next at most ``size`` bytes of the archive (b"" at its end); raises when the
        agent did not send all of it."""
        assert self._sender.stdout is not None
        data = self._sender.stdout.read(size)
        if not data and self._sender.wait() != 0:
            self._send_errors.seek(0)
            said = self._send_errors.read().decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"the agent could not send it: {said[-1] if said else 'no reason'}")
        return data

    def remove(self) -> None:
        """Remove the slot's directory (and the job's, once no slot is left in it)."""
        agent_files.remove(self.directory)
