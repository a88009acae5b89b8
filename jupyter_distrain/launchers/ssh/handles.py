"""The ssh launcher's process handles: a process on a host run by the agent under its
own ssh connection (:class:`SshProcess`), and one of mpirun's ranks (:class:`RemoteRank`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ...contract.launch import LaunchedProcess
from ..agent.client import HANG_UP_SECONDS, AgentClient, AgentProcess


class SshProcess(AgentProcess):
    """One process on a host (or a host's guard), run by the agent under its own ssh
    connection; :attr:`agent` talks to the agent over the connection's pipes."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        host: str,
        log_path: Path,
        request: dict[str, Any] | None = None,
        payload: bytes = b"",
    ):
        assert popen.stdin is not None and popen.stderr is not None
        self.popen = popen
        self.host = host
        self.log_path = log_path
        super().__init__(AgentClient(popen.stdin, popen.stderr, request, payload))

    def _code(self) -> int:
        self.agent.wait_ended(HANG_UP_SECONDS)
        return self.final_code()

    def note_lost(self) -> None:
        """The connection is why."""
        said = self.agent.said(f"ssh exited with {self.popen.returncode}")
        with open(self.log_path, "a") as log_file:
            log_file.write(f"\njupyter_distrain: lost the connection to host {self.host}: {said}\n")

    def wait(self) -> int:
        self.popen.wait()
        return self._code()

    def poll(self) -> int | None:
        if self.popen.poll() is None:
            return None
        return self._code()

    def hang_up(self) -> None:
        """End the connection (the agent then kills whatever is left on its host)."""
        self.agent.hang_up()

    def wait_closed(self, seconds: float) -> None:
        """Wait for ssh to end after :meth:`hang_up`; kill it when it does not."""
        try:
            self.popen.wait(seconds)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class RemoteRank(LaunchedProcess):
    """One of mpirun's ranks on a host: it reports its own exit (bye) and lives no
    longer than mpirun; signals go through the host's guard session."""

    own_job_dir = True

    def __init__(self, pid: int, host: str, guard: SshProcess, mpirun: LaunchedProcess):
        self.pid = pid
        self.host = host
        self.guard = guard
        self.mpirun = mpirun

    def poll(self) -> int | None:
        return None if self.mpirun.poll() is None else 0

    def wait(self) -> int:
        self.mpirun.wait()
        return 0

    def signal(self, sig: int, tree: bool = False) -> None:
        self.guard.agent.kill(self.pid, sig)

    def receive_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self.guard.agent.send_file(name, data)

    def memory_bytes(self) -> int:
        return 0  # not measured on the host (mpirun's ranks): --memory does not apply
