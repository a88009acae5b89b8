"""SSH launcher: the job's processes on other hosts, over OpenSSH with passwordless keys.

At submit (in the notebook) every host is checked in parallel (:mod:`.preflight`):
nothing starts unless all pass. Each process's handle is in :mod:`.handles`, Horovod
over MPI in :mod:`.mpi`, what comes back from the hosts at the end in
:mod:`.bring_back`.

Each process runs under one ssh connection that runs the remote agent
(:mod:`jupyter_distrain.launchers.agent`): the process's output comes back on the connection
into its log here; its pid, start time, memory and exit code come back as marked
lines; signals go the other way. The connection also forwards two Unix sockets on
the host to the supervisor's control and metrics sockets here (``ssh -R``), so the
channels never listen on a network and stay signed with the job's secret. A
connection that is lost (ssh's keepalives) fails the process here; the agent kills
the process tree on its host when its connection ends or goes silent.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...contract.launch import ELASTIC, MPIRUN, LaunchedProcess, ProcessSpec, Slot
from ...contract.private import runtime_dir
from ...contract.process import Env
from ...contract.spec import JobSpec, SpecError
from ..agent.client import HANG_UP_SECONDS
from ..agent.delivery import result_slots
from ..agent.pooled import pool_request
from ..base import Launcher, LauncherKind, LauncherOption, in_range, matching
from ..limits import thread_env
from ..remote.bring_back import bring_back
from .bring_back import holder
from .carry import Carrier, check_each
from .connection import CONTROL_DIR_CHARS, SshOptions, on_each
from .handles import RemoteRank, SshProcess
from .kept import close_kept, kept, kept_masters
from .lanes import Lanes
from .mpi import start_mpirun
from .pools import host_pools
from .pools import remember as remember_pool_host
from .preflight import RemoteHost, preflight

log = logging.getLogger(__name__)


def _control_dir() -> str:
    """A new private directory for the job's ssh master sockets; "" (no sharing) where
    its path would be too long for ssh's socket names (a 40-character hash and a
    temporary suffix go after it)."""
    path = runtime_dir() / f"ssh-{secrets.token_hex(4)}"
    if len(str(path)) > CONTROL_DIR_CHARS:
        return ""
    path.mkdir(mode=0o700)
    return str(path)


SSH_OPTIONS = (
    LauncherOption(
        "hosts",
        str,
        "",
        "ssh launcher: host:slots,... or a hostfile",
        only_for="a multi-host launcher",
    ),
    LauncherOption(
        "ssh_port",
        int,
        22,
        "ssh launcher: the port",
        check=in_range(1, 65535, "a port number 1-65535"),
    ),
    LauncherOption(
        "ssh_user",
        str,
        "",
        "ssh launcher: the user on the hosts",
        check=matching(r"^[a-z_][a-z0-9_.-]{0,31}$", "a user name"),
    ),
    LauncherOption("ssh_identity", str, "", "ssh launcher: private key", metavar="FILE"),
    LauncherOption("ssh_known_hosts", str, "", "ssh launcher: known_hosts", metavar="FILE"),
    LauncherOption(
        "ssh_accept_new_hosts",
        bool,
        False,
        "ssh launcher: accept and record the key of a host seen for the first time",
    ),
    LauncherOption("remote_python", str, "", "ssh launcher: the interpreter on the hosts"),
    LauncherOption(
        "network_interface",
        str,
        "",
        "ssh launcher: the interface to use",
        check=matching(r"^[A-Za-z0-9_.:@-]{1,15}$", "an interface name"),
    ),
)


class SshKind(LauncherKind):
    """What the ssh launcher is and checks at submit: its options and capabilities, the
    hosts' pre-flight, its isolation (none: the user asked for hosts), the hosts' pools
    and the connections it keeps."""

    name = "ssh"
    declared_options = SSH_OPTIONS
    supports = frozenset({MPIRUN})
    why_not = {
        ELASTIC: " yet: its rendezvous server would take (and unpickle) requests from any "
        "host on the network"
    }

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        if spec.uses_mpirun() and not shutil.which("mpirun"):
            raise SpecError("--controller mpi needs mpirun here (Debian: openmpi-bin)")
        if not cls.option_values(spec)["hosts"]:
            raise SpecError("--launcher ssh needs --hosts host:slots,... (or a hostfile)")
        hosts = preflight(spec, cls.option_values(spec), processes, sys.executable)
        return dataclasses.replace(spec, placement=[dataclasses.asdict(h) for h in hosts])

    @classmethod
    def notes(cls, spec: JobSpec) -> list[str]:
        hosts = [RemoteHost(**h) for h in spec.placement]
        listed = ", ".join(
            (h.name if h.name == h.address else f"{h.name} at {h.address}")
            + f" ({h.iface}, {h.slots} slot{'s' * (h.slots > 1)})"
            for h in hosts
        )
        return [f"Hosts checked: {listed}"]

    @classmethod
    def isolate(cls) -> str | None:
        return "the ssh launcher runs the job on other hosts"

    @classmethod
    def runs_on_other_hosts(cls, spec: JobSpec) -> bool:
        return True

    @classmethod
    def remote_pools(cls, drain: bool = False) -> dict[str, Any]:
        return host_pools(drain)

    @classmethod
    def kept_connections(cls) -> list[str]:
        return [
            f"ssh connection kept to {master.host}: pid {master.pid}; "
            f"ends after {master.options.keep} s unused"
            for master in kept_masters()
        ]

    @classmethod
    def retire_kept(cls) -> list[str]:
        return close_kept()


class SshLauncher(Launcher):
    """Places slots on ``--hosts`` in order, filling each host's slots first."""

    kind = SshKind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        given = SshOptions.of(
            self.kind.option_values(self.spec), self.spec.python or sys.executable
        )
        self.options = kept(given)
        self._control_dir = ""  # the job's own masters' (none kept)
        if not self.options.keep:
            self._control_dir = _control_dir()
            self.options = dataclasses.replace(
                given, control_path=f"{self._control_dir}/%C" if self._control_dir else ""
            )
        self.hosts = [
            RemoteHost(**h) for h in self.spec.placement if h["name"] not in self.spec.left_out
        ]
        self._files = Carrier(self.job, self.options, self._host)
        self._lanes = Lanes(self.options, self.spec.timeout)  # the connections to each host
        self._processes: list[SshProcess] = []  # every session: processes and guards
        self._guards: dict[str, SshProcess] = {}  # by host name: for mpirun's ranks
        self._mpirun: LaunchedProcess | None = None
        self._starts = 0
        self._result_hosts: set[str] = set()  # the host of rank 0: the result comes from it
        self._pooled_hosts: set[str] = set()  # hosts asked for warm processes

    def _host(self, name: str) -> RemoteHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ValueError(f"{name!r} is not one of the job's hosts")

    def place(self, n: int) -> list[Slot]:
        slots: list[Slot] = []
        for host in self.hosts:
            for local in range(host.slots):
                if len(slots) < n:
                    slots.append(Slot(host.name, host.address, len(slots), local, host.iface))
        used = list(dict.fromkeys(s.host for s in slots))
        check_each(on_each(used, self._open_master))
        self._files.new_generation(used)
        if self.spec.uses_mpirun():  # its ranks need the guard sessions' forwards
            self._files.unpack_all(used)
            for name in used:
                self._guard(name)
        return slots

    def _open_master(self, name: str) -> None:
        self.options.open_master(name, timeout=self.spec.timeout)

    def _guard(self, name: str) -> None:
        """A session that holds ``name`` for the ranks mpirun starts there: it forwards
        the channels' sockets into the job's directory on the host, and when it ends
        the agent kills whatever of the job is left there."""
        directory, host = self._directory(name), self._host(name)
        forwards = []
        for channel in ("control", "metrics"):
            remote = host.guard_socket(self.job.id, channel)
            forwards += ["-R", f"{remote}:{self.job.socket_path(channel)}"]
        log_path = self.job.logs_dir / f"guard-{self._host(name).hostname}.log"
        self._guards[name] = self._session(name, ["guard", directory], forwards, log_path)

    def _directory(self, name: str) -> str:
        return self._host(name).directory(self.job.id)

    def driver_address(self) -> str:
        return self.hosts[0].driver

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        return self._files.reserve_ports(slots)

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        self._result_hosts.update(slot.host for slot in result_slots(proc))
        if proc.hosts:  # mpirun: here, starting the ranks over ssh itself
            argv = self._remote_argv(proc.argv)
            self._mpirun = start_mpirun(self, self.options, self.hosts, proc, argv, log_path)
            return self._mpirun
        assert proc.slot is not None, "every process of an ssh job has a slot"
        name = proc.slot.host
        directory = self._directory(name)
        self._starts += 1
        forwards, remote_env = [], {}
        for key, scheme in ((Env.CONTROL, "unix:"), (Env.METRICS, "ipc://")):
            local = proc.env[key].removeprefix(scheme)
            channel = key.rsplit("_", 1)[1].lower()
            remote = self._host(name).socket(self.job.id, self._starts, channel)
            forwards += ["-R", f"{remote}:{local}"]
            remote_env[key] = scheme + remote
        env = {**thread_env(self.spec.cpu), **self.spec.env, **proc.env, **remote_env}
        env[Env.JOB_DIR] = directory
        request = {
            "argv": self._remote_argv(proc.argv),
            "env": env,
            "sockets": [f.split(":")[0] for f in forwards[1::2]],
        }
        pool = pool_request(self.spec, proc.argv, env, self.run_id)
        if pool:
            request["pool"] = pool
            if name not in self._pooled_hosts:
                self._pooled_hosts.add(name)
                remember_pool_host(name, self.options)
        request["run"] = self.run_id
        payload = self._files.files_for(name, request)
        # not waiting for its pid: the next start's ssh connects meanwhile
        return self._session(name, ["run", directory], forwards, log_path, request, payload)

    def _session(
        self,
        name: str,
        agent_args: list[str],
        forwards: list[str],
        log_path: Path,
        request: dict[str, Any] | None = None,
        payload: bytes = b"",
    ) -> SshProcess:
        """An ssh session on ``name`` running the agent (sent ``request`` first, then
        ``payload``), its stdout appended to ``log_path``."""
        lane, options = self._lanes.choose(name)
        with open(log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                options.ssh_argv(name, options.agent(*agent_args), *forwards),
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        handle = SshProcess(popen, name, log_path, request, payload)
        self._processes.append(handle)
        self._lanes.add(name, lane, handle, forwards)
        return handle

    def _remote_argv(self, argv: list[str]) -> list[str]:
        """``argv`` with this machine's worker interpreter replaced by the hosts'."""
        local = self.spec.python or sys.executable
        return [self.options.python if arg == local else arg for arg in argv]

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        """One of mpirun's ranks, by its pid on the host that calls itself ``host``."""
        for remote in self.hosts:
            if remote.hostname == host and remote.name in self._guards and self._mpirun:
                return RemoteRank(pid, remote.name, self._guards[remote.name], self._mpirun)
        return None

    def sweep(self) -> None:
        for handle in self._processes:
            handle.hang_up()
        deadline = time.monotonic() + HANG_UP_SECONDS
        for handle in self._processes:
            handle.wait_closed(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.sweep()
        holders = [
            holder(self.options, name, self._directory(name), name in self._result_hosts)
            for name in sorted(self._files.unpacked)
        ]
        bring_back(self.job.path, holders, self.warn)
        self._lanes.close([h.name for h in self.hosts])
        self._files.unpacked.clear()
        if self._control_dir:
            shutil.rmtree(self._control_dir, ignore_errors=True)
