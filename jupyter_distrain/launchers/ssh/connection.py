"""Running the remote agent on a host over OpenSSH: options, commands, readable errors.

Host keys are always checked (``StrictHostKeyChecking=yes``, or ``accept-new`` when
the user passes ``--ssh-accept-new-hosts``); ssh never asks anything (``BatchMode``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

AGENT_MODULE = "jupyter_distrain.launchers.agent"
ALIVE_INTERVAL = 2  # seconds between ssh's keepalives; 3 unanswered end the connection
CONNECT_TIMEOUT = 10
# the longest directory for master sockets: ssh adds a 40-character hash (%C) and a
# temporary suffix, within a Unix socket's 108 bytes
CONTROL_DIR_CHARS = 45

T = TypeVar("T")
H = TypeVar("H")


class RemoteError(RuntimeError):
    """An ssh command on a host failed; the message is one line naming the host."""


@dataclass(frozen=True)
class SshOptions:
    """How to reach every host of a job."""

    port: int = 22
    user: str = ""
    identity: str = ""
    known_hosts: str = ""
    accept_new: bool = False
    python: str = ""  # the interpreter on the hosts
    control_path: str = ""  # ssh's ControlPath: connections share a master per host
    keep: int = 0  # seconds a master outlives its last session (0: until close_master)

    @classmethod
    def of(cls, given: Mapping[str, Any], python: str) -> SshOptions:
        """From the ssh launcher's option values (``SshKind.option_values``); ``python``
        is the interpreter on the hosts where ``--remote-python`` is not given."""
        return cls(
            given["ssh_port"],
            given["ssh_user"],
            given["ssh_identity"],
            given["ssh_known_hosts"],
            given["ssh_accept_new_hosts"],
            given["remote_python"] or python,
        )

    def described(self) -> dict[str, Any]:
        """How to reach a host, without where its master connection is (kept on disk)."""
        return dataclasses.asdict(dataclasses.replace(self, control_path="", keep=0))

    @classmethod
    def from_described(cls, described: Mapping[str, Any]) -> SshOptions:
        """Back from :meth:`described` (names it does not know are left out)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in described.items() if k in fields})

    def _options(self, master: str = "no") -> list[str]:
        checking = "accept-new" if self.accept_new else "yes"
        # -a -x: never the user's agent or X display to a host (a ForwardAgent yes in
        # their ssh config would hand the agent to every host of every job)
        argv = ["ssh", "-a", "-x", "-p", str(self.port), "-o", "BatchMode=yes"]
        argv += ["-o", f"StrictHostKeyChecking={checking}", "-o", "LogLevel=ERROR"]
        argv += ["-o", f"ServerAliveInterval={ALIVE_INTERVAL}", "-o", "ServerAliveCountMax=3"]
        argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "ExitOnForwardFailure=yes"]
        if self.identity:
            argv += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.user:
            argv += ["-l", self.user]
        if self.control_path:  # through the host's master connection where there is one
            argv += ["-o", f"ControlPath={self.control_path}", "-o", f"ControlMaster={master}"]
        return argv

    def rsh_options(self) -> list[str]:
        """The options for another program's ssh (OpenMPI's rsh agent): no master."""
        return dataclasses.replace(self, control_path="")._options()[1:]

    def ssh_argv(self, host: str, remote: Sequence[str], *options: str) -> list[str]:
        """``ssh ... host -- remote`` with these options (``-R``, ...)."""
        return [*self._options(), *options, host, "--", shlex.join(remote)]

    def open_master(self, host: str, timeout: float = 60) -> bool:
        """Start the master connection to ``host`` that later commands share (one
        handshake per host, not per process), unless a kept one is already there; it
        runs until :meth:`close_master`, or until it has been unused for ``keep``
        seconds. Whether it started one."""
        if not self.control_path:
            return False
        with self._opening(host):  # two at once: the second would be a stray connection
            if self.keep:
                if self.master_pid(host):
                    return False
                _remove_dead_sockets(os.path.dirname(self.control_path))
            persist = f"{self.keep}s" if self.keep else "yes"
            argv = [*self._options("yes"), "-N", "-f", "-o", f"ControlPersist={persist}", host]
            with tempfile.TemporaryFile() as errors:  # a pipe would stay open in the master
                try:
                    code = subprocess.run(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=errors,
                        timeout=timeout,
                    ).returncode
                except subprocess.TimeoutExpired:
                    raise RemoteError(f"host {host}: no answer within {timeout:g} s") from None
                if code != 0:
                    errors.seek(0)
                    said = errors.read().decode(errors="replace")
                    raise RemoteError(explain(host, code, said, self))
        return True

    @contextlib.contextmanager
    def _opening(self, host: str) -> Iterator[None]:
        """Held while a master to ``host`` is checked for and opened (a lock file beside
        the masters' sockets: kept masters are shared by processes)."""
        digest = hashlib.sha256(host.encode()).hexdigest()[:12]
        with open(f"{os.path.dirname(self.control_path)}/{digest}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def master_pid(self, host: str) -> int | None:
        """The pid of the master connection to ``host``, if one is running."""
        if not self.control_path:
            return None
        argv = [*self._options(), "-O", "check", host]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return None
        found = re.search(rb"pid=(\d+)", done.stderr)
        return int(found.group(1)) if done.returncode == 0 and found else None

    def cancel_forwards(self, host: str, forwards: Sequence[str]) -> None:
        """Take ``forwards`` (``-R`` options) off ``host``'s master: sessions that asked
        for them through it leave them there when they end."""
        if self.control_path and forwards:
            argv = [*self._options(), "-O", "cancel", *forwards, host]
            subprocess.run(argv, capture_output=True, timeout=10)

    def close_master(self, host: str) -> None:
        """End ``host``'s master connection (and every session still on it)."""
        self._control(host, "exit")

    def retire_master(self, host: str) -> None:
        """Have ``host``'s master take no new session (its socket goes, so the next job
        opens a new one) and end with its last one: at once when none is open, else
        when the job that uses it ends."""
        self._control(host, "stop")

    def _control(self, host: str, command: str) -> None:
        if self.control_path:
            argv = [*self._options(), "-O", command, host]
            subprocess.run(argv, capture_output=True, timeout=10)

    def agent(self, *args: str) -> list[str]:
        """The remote command line that runs the agent with ``args``."""
        return [self.python, "-m", AGENT_MODULE, *args]

    def run(self, host: str, args: Sequence[str], data: bytes = b"", timeout: float = 60) -> bytes:
        """Run the agent on ``host``; its stdout, or :class:`RemoteError` explaining why not."""
        try:
            done = subprocess.run(
                self.ssh_argv(host, self.agent(*args)),
                input=data,
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(f"host {host}: no answer within {timeout:g} s") from None
        if done.returncode != 0:
            raise RemoteError(
                explain(host, done.returncode, done.stderr.decode(errors="replace"), self)
            )
        return done.stdout


def _remove_dead_sockets(directory: str) -> None:
    """Remove the sockets of masters that died (killed, or their machine rebooted) from
    ``directory``: ssh opens no master where a socket of that name is left, and would
    run the connection meant to be the master as a lone one instead, for ever (``-N``)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            try:  # another host's opening may remove it, or ssh rename its temporary one
                if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    continue
            except FileNotFoundError:
                continue
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(entry.path)
                except ConnectionRefusedError:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                except OSError:
                    pass


def agent_answer(host: str, out: bytes) -> Any:
    """The JSON line an agent's command on ``host`` ended its output with, or
    :class:`RemoteError` saying what it answered instead."""
    try:
        return json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"host {host}: the agent answered {out[:200]!r}") from None


def explain(host: str, code: int, stderr: str, options: SshOptions) -> str:
    """One line saying why an ssh command on ``host`` failed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    text = " ".join(lines)
    if "IDENTIFICATION HAS CHANGED" in text:
        return (
            f"host {host}: its host key has changed since it was recorded in known_hosts: "
            "refusing it (if the change is expected, remove the old key with ssh-keygen -R)"
        )
    if "Host key verification failed" in text:
        return (
            f"host {host}: its host key is not in known_hosts: add it (ssh-keyscan) "
            "or pass --ssh-accept-new-hosts to accept it on first contact"
        )
    if "remote port forwarding failed" in text:
        return (
            f"host {host}: its sshd refuses to forward the job's Unix sockets "
            "(sshd_config: AllowStreamLocalForwarding, AllowTcpForwarding, DisableForwarding)"
        )
    if "Permission denied" in text:
        who = f"user {options.user}" if options.user else "this user"
        return f"host {host}: ssh refused the key for {who} (Permission denied; --ssh-identity?)"
    if re.search(r"No module named '?jupyter_distrain\b", text):
        return (
            f"host {host}: {options.python} cannot import jupyter_distrain: install the "
            "package there, or point --remote-python at an interpreter that has it"
        )
    if code == 127 or (code != 255 and "No such file or directory" in text):
        return f"host {host}: no Python interpreter at {options.python} (--remote-python)"
    if code == 255:  # ssh's own failure: its message says what (refused, timed out, ...)
        reason = lines[-1] if lines else "ssh failed"
        return f"host {host}: {reason.removeprefix('ssh: ')}"
    reason = lines[-1] if lines else f"exit code {code}"
    return f"host {host}: {reason}"


def on_each(hosts: Sequence[H], work: Callable[[H], T]) -> list[T | RemoteError]:
    """``work(host)`` for every host in parallel; each result, or the error it raised."""

    def attempt(host: H) -> T | RemoteError:
        try:
            return work(host)
        except RemoteError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        return list(pool.map(attempt, hosts))
