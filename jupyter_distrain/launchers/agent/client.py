"""The launchers' side of the host agent (:mod:`.host`): one client for the ssh
launcher (the agent's pipes are an ssh session's), the Ray launcher (the pipes of the
agent subprocess a slot's actor starts on its node) and the Slurm launcher (a task's
share of its srun step's streams); :class:`AgentProcess` is the handle they share.

A :class:`AgentClient` writes command lines to the agent's stdin (the request first,
then ``ping``, ``signal`` or ``kill``) and reads its stderr: marked report lines
(:data:`~.host.MARK`: pid and start time, memory, exit code) and, unmarked, what
ssh, Python or the agent said. An agent that ended without reporting an exit code
was lost: :data:`EXIT_LOST`. :func:`job_files_archive` builds what is sent to a host
before anything starts there. :func:`notebook_id` and :func:`live_job_ids` tell a
host's pre-flight which of its job directories belong to jobs of this notebook that
are over (its leftovers, removed there).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import socket
import tarfile
import threading
from pathlib import Path
from typing import IO, Any

from ...contract.control import CONTROL_FILE, ControlInfo
from ...contract.handoff import Handoff
from ...contract.launch import LaunchedProcess
from ...version import __version__
from .files import CARRIED, COPIED, HANDED
from .host import FILE, KILL, MARK, PING, PROTOCOL, SIGNAL

log = logging.getLogger(__name__)

EXIT_LOST = 255  # the agent ended without reporting an exit code (ssh's own failure code)
HANG_UP_SECONDS = 5.0  # for an agent to end once its stdin is closed
PING_SECONDS = 2.0  # the agent kills its process after HEARTBEAT_TIMEOUT without one


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def other_version(where: str, info: dict[str, Any]) -> str:
    """The line refusing ``where`` ("host NAME", "Ray node NAME") whose agent, as its
    ``info`` says ({} when it did not understand the question), speaks another protocol."""
    theirs = (
        f"jupyter_distrain {info['version']}" if "version" in info else "an older jupyter_distrain"
    )
    return (
        f"{where} runs {theirs} (agent protocol {info.get('protocol', 1)}), this notebook "
        f"{__version__} (protocol {PROTOCOL}): install the same version there"
    )


def notebook_id(root: Path) -> str:
    """Who owns a job's directories on the hosts: this machine and its jobs root
    ``root`` (two notebooks differ in one or the other), hashed."""
    machine = socket.gethostname()
    for name in MACHINE_ID_FILES:
        with contextlib.suppress(OSError):
            machine = Path(name).read_text().strip() or machine
            break
    return hashlib.sha256(f"{machine}\0{root.resolve()}".encode()).hexdigest()[:32]


def live_job_ids(root: Path) -> list[str]:
    """The jobs under ``root`` whose files a host must keep: those whose supervisor is
    alive or not started yet (being submitted). Once it is dead its sessions are gone
    and the agents kill what is left (:data:`~.host.HEARTBEAT_TIMEOUT`); the pids a
    job recorded are the hosts' and say nothing here."""
    from ...contract.store import list_job_dirs

    return [
        job_dir.id for job_dir in list_job_dirs(root) if job_dir.supervisor_alive() is not False
    ]


def job_files_archive(job_path: Path, in_memory: bool = False) -> bytes:
    """A tar of the job's files a host needs (:data:`~.files.COPIED`) and what a restarted
    job carries back to its hosts (:data:`~.files.CARRIED`). ``in_memory``: the secret
    and the pushed values are handed to each process instead (:mod:`...contract.handoff`)
    and stay out, and so do the values of ``--env`` in ``spec.json`` (each process gets
    them in its environment)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in (*COPIED, *CARRIED):
            if in_memory and entry in HANDED:
                continue
            if in_memory and entry == "spec.json":
                spec = json.loads((job_path / entry).read_text())
                spec["env"] = dict.fromkeys(spec.get("env", {}), "")
                member = tarfile.TarInfo(entry)
                data = json.dumps(spec).encode()
                member.size, member.mode = len(data), 0o600
                tar.addfile(member, io.BytesIO(data))
            elif (job_path / entry).exists():
                tar.add(job_path / entry, entry)
    return buffer.getvalue()


def handoff_of(job_path: Path) -> dict[str, str]:
    """What the processes of a job whose files went ``in_memory`` are handed (as request
    fields: :meth:`...contract.handoff.Handoff.fields`)."""
    control = ControlInfo.read(job_path / CONTROL_FILE)
    pushed = job_path / "push.pkl"
    return Handoff(
        control.secret if control is not None else "",
        pushed.read_bytes() if pushed.exists() else b"",
    ).fields()


class AgentClient:
    """One run of the agent (``run`` or ``guard``) over its stdin (``commands``) and its
    stderr (``reports``). ``request``, when given, is sent first (``run`` reads its
    process's argv and environment from the first line), and ``payload`` right after it
    (the job's files the request announces); then a ping every :data:`PING_SECONDS`
    until the agent ends or is hung up on."""

    def __init__(
        self,
        commands: IO[bytes],
        reports: IO[bytes],
        request: dict[str, Any] | None = None,
        payload: bytes = b"",
    ):
        self.commands = commands
        self.reports = reports
        self.pid = 0
        self.create_time = 0.0
        self.rss = 0
        self.oom = False  # the process was ended by its host's OOM killer
        self.pooled = False  # the process came from the host's warm pool
        self.exit_code: int | None = None  # as the agent reported it
        self.errors: list[str] = []  # the unmarked lines: what ssh or the agent said
        self._started = threading.Event()
        self._hung_up = threading.Event()
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="agent-reports", daemon=True)
        self._reader.start()
        if request is not None:
            self.send(json.dumps(request))
        if payload:
            with self._write_lock, contextlib.suppress(OSError, ValueError):
                self.commands.write(payload)
                self.commands.flush()
        threading.Thread(target=self._ping, name="agent-ping", daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.reports:
                line = raw.decode(errors="replace").rstrip("\n")
                if not line.startswith(MARK):
                    self.errors.append(line)
                    continue
                report = json.loads(line[len(MARK) :])
                if "pid" in report:  # pooled first: a reader seeing the pid sees it too
                    self.pooled = bool(report.get("pooled"))
                    self.pid, self.create_time = report["pid"], report["create_time"]
                    self._started.set()
                if report.get("removed"):
                    log.info("removed what ended jobs left on the host: %s", report["removed"])
                self.rss = report.get("rss", self.rss)
                if "exit" in report:
                    self.oom = report.get("oom") is True
                    self.exit_code = report["exit"]
        finally:
            self._started.set()

    def _ping(self) -> None:
        while self._reader.is_alive() and not self._hung_up.wait(PING_SECONDS):
            self.send(PING)

    def send(self, line: str) -> None:
        """One command line for the agent; ignored once the link is gone."""
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            self.commands.write(line.encode() + b"\n")
            self.commands.flush()

    def signal(self, sig: int, tree: bool) -> None:
        """``run``: send ``sig`` to the agent's process (and its tree, with ``tree``)."""
        self.send(f"{SIGNAL} {int(sig)} {int(tree)}")

    def send_file(self, name: str, data: bytes) -> None:
        """``run``, ``guard``: write ``data`` as ``name`` in the job's directory on the
        agent's host."""
        self.send(f"{FILE} {name} {base64.b64encode(data).decode()}")

    def kill(self, pid: int, sig: int) -> None:
        """``guard``: send ``sig`` to the job's process ``pid`` on the agent's host."""
        self.send(f"{KILL} {int(pid)} {int(sig)}")

    def wait_started(self, seconds: float) -> bool:
        """Whether the agent reported its process's pid within ``seconds``."""
        return self._started.wait(seconds) and self.pid != 0

    def ended(self) -> bool:
        """Whether the agent is gone (its stderr ended) and all it said has been read."""
        return not self._reader.is_alive()

    def wait_ended(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the agent to end; whether it has."""
        self._reader.join(seconds)
        return self.ended()

    def hang_up(self) -> None:
        """Close the agent's stdin: it kills whatever is left of its process tree and ends."""
        self._hung_up.set()
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            self.commands.close()

    def outcome(self) -> int:
        """The process's exit code as the agent reported it, else :data:`EXIT_LOST`
        (call once the agent has ended)."""
        return EXIT_LOST if self.exit_code is None else self.exit_code

    def said(self, otherwise: str) -> str:
        """What the agent's stderr said besides its reports, on one line (``otherwise``
        when it said nothing)."""
        return "; ".join(e for e in self.errors if e) or otherwise


class AgentProcess(LaunchedProcess):
    """A process the host agent runs on another machine (an ssh session's, a Slurm
    task's): its pid, start time and memory as :attr:`agent` reports them, and signals
    sent to it through the agent."""

    own_job_dir = True

    def __init__(self, agent: AgentClient):
        self.agent = agent
        self._noting = threading.Lock()
        self._noted = False  # the log says why there is no exit code

    def final_code(self) -> int:
        """The exit code the agent reported, else :data:`EXIT_LOST` once the process's log
        says why (:meth:`note_lost`): whichever thread asks first writes it, every other
        waits for it, since the job's failure reads the log's tail right after."""
        with self._noting:
            if self.agent.exit_code is None and not self._noted:
                self._noted = True
                self.note_lost()
        return self.agent.outcome()

    def note_lost(self) -> None:
        """Say in the process's log why it ended without an exit code."""

    @property
    def pid(self) -> int:  # type: ignore[override]
        return self.agent.pid

    @property
    def create_time(self) -> float | None:  # type: ignore[override]
        return self.agent.create_time if self.agent.pid else None

    @property
    def pooled(self) -> bool:  # type: ignore[override]
        return self.agent.pooled

    def signal(self, sig: int, tree: bool = False) -> None:
        self.agent.signal(sig, tree)

    def receive_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self.agent.send_file(name, data)

    def memory_bytes(self) -> int:
        return self.agent.rss

    def oom_killed(self) -> bool:
        return self.agent.oom

    def host_lost(self) -> bool:
        # the agent reports the exit of a process it ends, even one it is told to kill
        return self.agent.exit_code is None
