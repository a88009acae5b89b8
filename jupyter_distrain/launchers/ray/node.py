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

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...contract.process import Env
from ..agent import host as agent_host

ROOT = ".jupyter_distrain/ray"  # under the node's HOME
START_SECONDS = 30.0  # for the agent to report the process's pid
PING_SECONDS = 2.0
PUMP_BYTES = 1 << 20  # the most log bytes one pump returns
HANG_UP_SECONDS = 5.0
EXIT_LOST = 255  # the agent ended without reporting an exit code
# Run argv[1:] as a grandchild in a session of its own; the intermediate exits at once.
DETACH = (
    "import os, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def interface_of(address: str) -> str:
    """The network interface that holds ``address`` here ("" when none does)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return ""


def kill_tree(pid: int, create_time: float) -> None:
    """SIGKILL the process ``pid`` (if it is still the one started at ``create_time``)
    and everything below it."""
    import psutil

    try:
        root = psutil.Process(pid)
        if abs(root.create_time() - create_time) > 0.01:
            return
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()


def agent_env() -> dict[str, str]:
    """This worker's environment without what Ray set for its own workers."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


class AgentLink:
    """One run of the remote agent: the request goes in on its stdin, its reports come
    back on its stderr, its (the process's) output goes to ``log_path``."""

    def __init__(self, directory: Path, log_path: Path, request: dict[str, Any]):
        agent = [sys.executable, "-m", "jupyter_distrain.launchers.agent", "run", str(directory)]
        with open(log_path, "ab", buffering=0) as log_file:
            self.popen = subprocess.Popen(
                [sys.executable, "-c", DETACH, *agent],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.PIPE,
                env=agent_env(),
            )
        self.popen.wait()  # the intermediate: the agent goes on, holding the pipes
        self.pid = 0
        self.create_time = 0.0
        self.rss = 0
        self.exit_code: int | None = None
        self.errors: list[str] = []
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send(json.dumps(request))
        threading.Thread(target=self._ping, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.startswith(agent_host.MARK):
                self.errors.append(line)
                continue
            report = json.loads(line[len(agent_host.MARK) :])
            if "pid" in report:
                self.pid, self.create_time = report["pid"], report["create_time"]
                self._started.set()
            self.rss = report.get("rss", self.rss)
            if "exit" in report:
                self.exit_code = report["exit"]
        self._started.set()

    def _ping(self) -> None:
        while self._reader.is_alive():
            self.send("ping")
            time.sleep(PING_SECONDS)

    def send(self, line: str) -> None:
        """A line for the agent; ignored once it is gone."""
        assert self.popen.stdin is not None
        with self._lock, contextlib.suppress(OSError, ValueError):
            self.popen.stdin.write(line.encode() + b"\n")
            self.popen.stdin.flush()

    def wait_started(self) -> bool:
        return self._started.wait(START_SECONDS) and self.pid != 0

    def ended(self) -> bool:
        """Whether the agent is gone (its stderr ended) and all it said has been read."""
        return not self._reader.is_alive()

    def hang_up(self) -> None:
        """Close the agent's stdin (it kills what is left of the process tree), wait;
        kill the process tree here if the agent does not end."""
        with self._lock, contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        self._reader.join(HANG_UP_SECONDS)
        if self._reader.is_alive() and self.pid:
            kill_tree(self.pid, self.create_time)
            self._reader.join(HANG_UP_SECONDS)


class SlotAgent:
    """A Ray actor for one slot of one job (see the module docstring)."""

    def __init__(self, job_id: str, slot: int):
        self.directory = Path.home() / ROOT / job_id / f"slot{slot}"
        self.link: AgentLink | None = None
        self.log_path: Path | None = None

    def describe(self) -> dict[str, Any]:
        """Where this slot is: the node's IP, the interface holding it, the host name."""
        import ray

        address = ray.util.get_node_ip_address()
        return {
            "address": address,
            "iface": interface_of(address) or "lo",
            "hostname": socket.gethostname(),
        }

    def unpack(self, data: bytes) -> str:
        """Make the slot's private directory and extract the job's files (a tar) in it."""
        agent_host.make_private_dir(self.directory.parent.parent)
        agent_host.unpack(self.directory, data)
        return str(self.directory)

    def free_ports(self, address: str, count: int) -> list[int]:
        return agent_host.free_ports(address, count)

    def start(self, request: dict[str, Any], name: str, python: str) -> dict[str, Any]:
        """Start the process described by ``request`` (argv, env) with its output in
        ``logs/<name>.log`` here; ``python``, the supervisor's interpreter, is replaced by
        this node's in argv. Returns its pid and start time."""
        if self.link is not None:
            raise RuntimeError("this slot already runs a process")
        argv = list(request["argv"])
        if argv and argv[0] == python:
            argv[0] = sys.executable
        env = {**request["env"], Env.JOB_DIR: str(self.directory)}
        self.log_path = self.directory / "logs" / f"{name}.log"
        self.link = AgentLink(self.directory, self.log_path, {"argv": argv, "env": env})
        if not self.link.wait_started():
            said = "; ".join(e for e in self.link.errors if e) or "no report from the agent"
            raise RuntimeError(f"the process did not start: {said}")
        return {"pid": self.link.pid, "create_time": self.link.create_time}

    def pump(self, offset: int) -> dict[str, Any]:
        """New output from ``offset`` on, the process's memory, and its exit code once it
        has exited and all its output has been read."""
        if self.link is None or self.log_path is None:
            raise RuntimeError("this slot runs no process")
        ended = self.link.ended()  # before reading: output written before the end is in
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            data = log_file.read(PUMP_BYTES)
        code = None
        if ended and len(data) < PUMP_BYTES:
            code = self.link.exit_code
            if code is None:
                said = "; ".join(e for e in self.link.errors if e) or "no exit code"
                data += f"\njupyter_distrain: the agent on this node ended: {said}\n".encode()
                code = EXIT_LOST
        return {"data": data, "rss": self.link.rss, "exit": code}

    def signal(self, sig: int, tree: bool) -> None:
        if self.link is not None:
            self.link.send(f"signal {int(sig)} {int(tree)}")

    def hang_up(self) -> None:
        """End the process and whatever it left behind."""
        if self.link is not None:
            self.link.hang_up()

    def finish(self) -> bytes:
        """A tar of what the job produced here (its result, checkpoints); then the slot's
        directory is removed (and the job's, once no slot is left in it)."""
        self.hang_up()
        data = agent_host.pack(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.directory.parent.rmdir()
        return data
