"""SSH launcher: the job's processes on other hosts, over OpenSSH with passwordless keys.

At submit (in the notebook) every host is checked in parallel (``preflight``): ssh
reaches it with a known host key, its Python imports this package and the backend's
libraries, and the address the connection arrived on names the interface the job
uses there (``--network-interface`` forces one). Nothing starts unless all pass.

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
import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ... import __version__
from ...contract.cellcheck import uses_horovod_elastic
from ...contract.process import HOST_PLACEHOLDER, Env, ProcessId
from ...contract.spec import JobSpec, SpecError
from ...contract.store import jobs_root, runtime_dir
from ...processes import die_with_parent
from ..agent.client import (
    HANG_UP_SECONDS,
    AgentClient,
    job_files_archive,
    live_job_ids,
    notebook_id,
)
from ..agent.delivery import Delivery, PipeStream, Received, result_slots
from ..agent.host import JOBS_ROOT, PROTOCOL
from ..base import LaunchedProcess, Launcher, LauncherOption, ProcessSpec, Slot, in_range, matching
from ..handles import LocalProcess
from ..limits import thread_env
from .hosts import parse_hosts
from .session import RemoteError, SshOptions, explain, on_each

log = logging.getLogger(__name__)
_TAG_RE = re.compile(rb"\[\d+,(\d+)\]<std(?:out|err)>:")  # mpirun --tag-output
# what argparse says when an agent of another version does not know a command or option
_USAGE_RE = re.compile(r": error: (argument |unrecognized arguments|the following arguments)")

REMOTE_ROOT = JOBS_ROOT  # under the remote user's home
FINISH_SECONDS = 30.0  # with nothing coming back from a host, its files stay there
FINISH_TOTAL_SECONDS = 3600.0  # the longest one host's files may take to come back
MAX_SOCKET_BYTES = 107  # a Unix socket's path: sun_path holds 108 bytes, the last a NUL
MOST_STARTS = 999_999  # the longest start count in a socket's name (restarts included)


@dataclasses.dataclass(frozen=True)
class RemoteHost:
    """A host as the pre-flight found it."""

    name: str  # as named on --hosts
    slots: int
    address: str  # where the other hosts reach it
    iface: str
    home: str
    driver: str  # where it reached us from (this machine's address on that network)
    ports: list[int]
    hostname: str = ""  # the host's own name
    network: str = ""  # the address's network, CIDR
    orted: str = ""  # OpenMPI's daemon there, if any

    def directory(self, job_id: str) -> str:
        """The job's private directory on this host, named by the host's own name (so
        distinct even when hosts share a file system, and the same template for all)."""
        return f"{self.home}/{REMOTE_ROOT}/{job_id}/{self.hostname}"


def remote_socket(directory: str, start: int, channel: str) -> str:
    """Where the launcher's ``start``-th process finds the supervisor's ``channel``
    ("control", "metrics") on its host: a socket ssh forwards there (``-R``)."""
    return f"{directory}/{start}-{channel}.sock"


def _socket_problem(spec: JobSpec, name: str, info: dict[str, Any]) -> str:
    """Why the job's sockets cannot be made on ``name`` (too long a path), or ""."""
    job_id = f"{spec.name}-{'0' * 6}"  # as long as JobDir.create's: the name, 6 hex digits
    where = RemoteHost(name, 1, "", "", info["home"], "", [], info["name"]).directory(job_id)
    longest = len(remote_socket(where, MOST_STARTS, "control").encode())
    if longest <= MAX_SOCKET_BYTES:
        return ""
    return (
        f"host {name}: the job's sockets there ({where}/...) would have paths of up to "
        f"{longest} bytes, over the 108 a Unix socket's path may have (use a shorter --name)"
    )


def job_directory_template(job_id: str) -> str:
    """:meth:`RemoteHost.directory` as every host completes it (for mpirun's ranks)."""
    return f"~/{REMOTE_ROOT}/{job_id}/{HOST_PLACEHOLDER}"


def preflight(spec: JobSpec, processes: int, python: str) -> list[RemoteHost]:
    """Check every host in parallel; one :class:`SpecError` naming each that fails."""
    given = SshLauncher.option_values(spec)
    hosts = parse_hosts(given["hosts"])
    capacity = sum(h.slots for h in hosts)
    if processes > capacity:
        raise SpecError(
            f"--hosts offer {capacity} slots; the job needs {processes} processes "
            f"(--workers {spec.workers}" + (f" --ps {spec.ps})" if spec.ps else ")")
        )
    options = SshOptions.of(given, spec.python or python)
    args = ["preflight", "--backend", spec.backend, "--interface", given["network_interface"]]
    args.append("--leftovers")
    root = jobs_root()
    claims = json.dumps({"notebook": notebook_id(root), "live": live_job_ids(root)}).encode()

    def check(name: str) -> dict[str, Any]:
        slots = next(h.slots for h in hosts if h.name == name)
        try:
            out = options.run(name, [*args, "--ports", str(slots + 2)], claims, spec.timeout)
        except RemoteError as exc:
            if _USAGE_RE.search(str(exc)):  # an older agent: it knows no --leftovers
                raise RemoteError(_other_version(name, {})) from None
            raise
        try:
            info = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"host {name}: the agent answered {out[:200]!r}") from None
        if not isinstance(info, dict) or info.get("protocol") != PROTOCOL:
            raise RemoteError(_other_version(name, info if isinstance(info, dict) else {}))
        if info.get("removed"):
            log.info(
                "host %s: removed what jobs that are over left there: %s",
                name,
                ", ".join(info["removed"]),
            )
        return info

    found = on_each([h.name for h in hosts], check)
    problems = [str(f) for f in found if isinstance(f, RemoteError)]
    checked = [(h, i) for h, i in zip(hosts, found, strict=True) if isinstance(i, dict)]
    for host, info in checked:
        problems += _problems(spec, host.name, info, len(hosts))
    names = [info["name"] for _, info in checked]
    for host, info in checked:
        if names.count(info["name"]) > 1:
            problems.append(f"host {host.name}: another host has its name {info['name']!r}")
    if problems:
        raise SpecError("--hosts: " + "; ".join(problems))
    return [
        RemoteHost(
            h.name,
            h.slots,
            i["address"],
            i["iface"],
            i["home"],
            i["driver"],
            i.get("ports", []),
            i["name"],
            i.get("network", ""),
            i.get("orted", ""),
        )
        for h, i in checked
    ]


def _other_version(name: str, info: dict[str, Any]) -> str:
    """The line refusing host ``name`` whose agent (as its pre-flight ``info`` says, {}
    when it did not understand the question) speaks another protocol."""
    theirs = (
        f"jupyter_distrain {info['version']}" if "version" in info else "an older jupyter_distrain"
    )
    return (
        f"host {name} runs {theirs} (agent protocol {info.get('protocol', 1)}), this notebook "
        f"{__version__} (protocol {PROTOCOL}): install the same version there"
    )


def _problems(spec: JobSpec, name: str, info: dict[str, Any], hosts: int) -> list[str]:
    """What stops ``name`` (as its pre-flight found it) from running the job."""
    if not info["backend_ok"]:
        return [f"host {name}: backend {spec.backend}: {info['backend_why']}"]
    too_long = _socket_problem(spec, name, info)
    if too_long:
        return [too_long]
    if not info.get("address"):
        where = (
            SshLauncher.option_values(spec)["network_interface"] or "the interface ssh arrived on"
        )
        return [f"host {name}: no IPv4 address on {where}"]
    if spec.backend != "horovod" or hosts == 1:
        return []
    if spec.controller == "mpi" and not info.get("orted"):
        return [f"host {name}: --controller mpi needs OpenMPI there (no orted on its PATH)"]
    if spec.controller == "gloo" and not _routable(info["name_address"]):
        return [
            f"host {name}: its name {info['name']!r} resolves to "
            f"{info['name_address'] or 'nothing'}, which other hosts cannot reach; Horovod's "
            "Gloo listens there (map the name to the host's address in its /etc/hosts or DNS)"
        ]
    return []


def _control_dir() -> str:
    """A new private directory for the job's ssh master sockets; "" (no sharing) where
    its path would be too long for ssh's socket names (a 40-character hash and a
    temporary suffix go after it)."""
    path = runtime_dir() / f"ssh-{secrets.token_hex(4)}"
    if len(str(path)) > 45:
        return ""
    path.mkdir(mode=0o700)
    return str(path)


def _routable(address: str) -> bool:
    try:
        return not ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class SshProcess(LaunchedProcess):
    """One process on a host (or a host's guard), run by the agent under its own ssh
    connection; :attr:`agent` talks to the agent over the connection's pipes."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        host: str,
        log_path: Path,
        request: dict[str, Any] | None = None,
    ):
        assert popen.stdin is not None and popen.stderr is not None
        self.popen = popen
        self.host = host
        self.log_path = log_path
        self.agent = AgentClient(popen.stdin, popen.stderr, request)
        self._noted = False  # the log says the connection was lost

    @property
    def pid(self) -> int:  # type: ignore[override]
        return self.agent.pid

    @property
    def create_time(self) -> float | None:  # type: ignore[override]
        return self.agent.create_time if self.agent.pid else None

    def _code(self) -> int:
        self.agent.wait_ended(HANG_UP_SECONDS)
        if self.agent.exit_code is None:
            self._note_lost()
        return self.agent.outcome()

    def _note_lost(self) -> None:
        """Say in the process's log why it ended without an exit code: the connection."""
        if self._noted:
            return
        self._noted = True
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

    def signal(self, sig: int, tree: bool = False) -> None:
        self.agent.signal(sig, tree)

    def memory_bytes(self) -> int:
        return self.agent.rss

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

    def memory_bytes(self) -> int:
        return 0  # not measured on the host (mpirun's ranks): --memory does not apply


class SshLauncher(Launcher):
    """Places slots on ``--hosts`` in order, filling each host's slots first."""

    name = "ssh"
    declared_options = (
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._control_dir = _control_dir()
        self.options = dataclasses.replace(
            SshOptions.of(self.option_values(self.spec), self.spec.python or sys.executable),
            control_path=f"{self._control_dir}/%C" if self._control_dir else "",
        )
        self.hosts = [RemoteHost(**h) for h in self.spec.placement]
        self._free_ports = {h.name: list(h.ports) for h in self.hosts}
        self._unpacked: set[str] = set()
        self._processes: list[SshProcess] = []  # every session: processes and guards
        self._guards: dict[str, SshProcess] = {}  # by host name: for mpirun's ranks
        self._mpirun: LaunchedProcess | None = None
        self._starts = 0
        self._result_hosts: set[str] = set()  # the host of rank 0: the result comes from it

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        if spec.backend == "horovod" and spec.controller == "mpi" and not shutil.which("mpirun"):
            raise SpecError("--controller mpi needs mpirun here (Debian: openmpi-bin)")
        if spec.gpus:
            raise SpecError("--gpus is not supported by --launcher ssh yet")
        if spec.backend == "horovod" and uses_horovod_elastic(spec.code):
            raise SpecError(
                "Horovod elastic is not supported by --launcher ssh yet: its rendezvous "
                "server would take (and unpickle) requests from any host on the network"
            )
        if not cls.option_values(spec)["hosts"]:
            raise SpecError("--launcher ssh needs --hosts host:slots,... (or a hostfile)")
        hosts = preflight(spec, processes, sys.executable)
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
        failures = [r for r in on_each(used, self._unpack) if isinstance(r, RemoteError)]
        if failures:
            raise RuntimeError("; ".join(map(str, failures)))
        if self.spec.backend == "horovod" and self.spec.controller == "mpi":
            for name in used:
                self._guard(name)
        return slots

    def _guard(self, name: str) -> None:
        """A session that holds ``name`` for the ranks mpirun starts there: it forwards
        the channels' sockets into the job's directory on the host, and when it ends
        the agent kills whatever of the job is left there."""
        directory = self._directory(name)
        forwards = []
        for channel in ("control", "metrics"):
            forwards += ["-R", f"{directory}/{channel}.sock:{self.job.socket_path(channel)}"]
        log_path = self.job.logs_dir / f"guard-{self._host(name).hostname}.log"
        self._guards[name] = self._session(name, ["guard", directory], forwards, log_path)

    def _unpack(self, name: str) -> None:
        self.options.open_master(name, timeout=self.spec.timeout)
        files = job_files_archive(self.job.path)
        owner = notebook_id(self.job.path.parent)
        self.options.run(name, ["unpack", self._directory(name), "--owner", owner], files)
        self._unpacked.add(name)

    def _directory(self, name: str) -> str:
        return self._host(name).directory(self.job.id)

    def driver_address(self) -> str:
        return self.hosts[0].driver

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        try:
            return [self._free_ports[slot.host].pop(0) for slot in slots]
        except IndexError:
            raise RuntimeError("the pre-flight reserved too few ports") from None

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        self._result_hosts.update(slot.host for slot in result_slots(proc))
        if proc.hosts:  # mpirun: here, starting the ranks over ssh itself
            self._mpirun = self._start_mpirun(proc, log_path)
            return self._mpirun
        assert proc.slot is not None, "every process of an ssh job has a slot"
        name = proc.slot.host
        directory = self._directory(name)
        self._starts += 1
        forwards, remote_env = [], {}
        for key, scheme in ((Env.CONTROL, "unix:"), (Env.METRICS, "ipc://")):
            local = proc.env[key].removeprefix(scheme)
            remote = remote_socket(directory, self._starts, key.rsplit("_", 1)[1].lower())
            forwards += ["-R", f"{remote}:{local}"]
            remote_env[key] = scheme + remote
        env = {**thread_env(self.spec.cpu), **self.spec.env, **proc.env, **remote_env}
        env[Env.JOB_DIR] = directory
        request = {
            "argv": self._remote_argv(proc.argv),
            "env": env,
            "sockets": [f.split(":")[0] for f in forwards[1::2]],
        }
        # not waiting for its pid: the next start's ssh connects meanwhile
        return self._session(name, ["run", directory], forwards, log_path, request)

    def _session(
        self,
        name: str,
        agent_args: list[str],
        forwards: list[str],
        log_path: Path,
        request: dict[str, Any] | None = None,
    ) -> SshProcess:
        """An ssh session on ``name`` running the agent (sent ``request`` first), its
        stdout appended to ``log_path``."""
        with open(log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                self.options.ssh_argv(name, self.options.agent(*agent_args), *forwards),
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        handle = SshProcess(popen, name, log_path, request)
        self._processes.append(handle)
        return handle

    def _remote_argv(self, argv: list[str]) -> list[str]:
        """``argv`` with this machine's worker interpreter replaced by the hosts'."""
        local = self.spec.python or sys.executable
        return [self.options.python if arg == local else arg for arg in argv]

    def _start_mpirun(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        """mpirun here; it starts OpenMPI's daemon on each host over ssh (the same
        options: port, key, known hosts), which starts the ranks. Every rank gets the
        same environment, so the job directory is a template each host completes."""
        template = job_directory_template(self.job.id)
        env = {**os.environ, **thread_env(self.spec.cpu), **self.spec.env, **proc.env}
        env[Env.JOB_DIR] = template
        env[Env.CONTROL] = f"unix:{template}/control.sock"
        env[Env.METRICS] = f"ipc://{template}/metrics.sock"
        env[Env.RANK_OUTPUT] = "mpirun"
        networks = ",".join(sorted({h.network for h in self.hosts}))
        argv = self._remote_argv(proc.argv)
        argv[1:1] = [
            *("--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_no_tree_spawn", "1"),
            *("--mca", "plm_rsh_args", shlex.join(self.options.rsh_options())),
            *("--mca", "oob_tcp_if_include", networks),
            *("--mca", "btl_tcp_if_include", networks),
            *("-x", Env.RANK_OUTPUT, "--tag-output"),
        ]
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        threading.Thread(target=self._sort_output, args=(popen, log_path), daemon=True).start()
        return LocalProcess(popen)

    def _sort_output(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        """Each rank's output (mpirun tags every chunk a rank writes, several chunks may
        share a line) into that rank's log; the rest into mpirun's own."""
        assert popen.stdout is not None
        logs: dict[Path, Any] = {}

        def write(path: Path, data: bytes) -> None:
            if path not in logs:
                logs[path] = open(path, "ab", buffering=0)  # noqa: SIM115
            logs[path].write(data)

        try:
            for line in popen.stdout:
                untagged, *tagged = _TAG_RE.split(line)
                if untagged:
                    write(log_path, untagged)
                for rank, chunk in zip(tagged[::2], tagged[1::2], strict=True):
                    write(self.job.log_file(ProcessId("worker", int(rank))), chunk)
        finally:
            for file in logs.values():
                file.close()

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
        delivery = Delivery(self.job.path, self.warn)
        names = sorted(self._unpacked)
        failures = on_each(names, lambda name: self._finish(name, delivery))
        for failure in failures:
            if failure is not None:
                self.warn(str(failure))
        on_each([h.name for h in self.hosts], self.options.close_master)
        self._unpacked.clear()
        if self._control_dir:
            shutil.rmtree(self._control_dir, ignore_errors=True)

    def _finish(self, name: str, delivery: Delivery) -> None:
        """Bring back what the job produced on ``name`` (rank 0's result, checkpoints:
        what :mod:`..agent.delivery` accepts), streamed; the job's directory there is
        removed only once that is stored here."""
        directory = self._directory(name)
        try:
            received = self._receive(name, directory, delivery)
        except OSError as exc:  # no ssh to start (EAGAIN, EMFILE)
            received = Received(f"host {name}", problem=f"cannot run ssh: {exc}")
        if not received.complete:
            raise RemoteError(
                f"host {name}: what the job produced there was not brought back "
                f"({received.problem}); it stays there in {directory}"
            )
        self.options.run(name, ["remove", directory])

    def _receive(self, name: str, directory: str, delivery: Delivery) -> Received:
        """The agent's ``send`` on ``name``, read into ``delivery`` as it comes."""
        argv = self.options.ssh_argv(name, self.options.agent("send", directory))
        with (
            tempfile.TemporaryFile() as errors,
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                start_new_session=True,
            ) as ssh,
        ):

            def ended() -> None:  # the archive's end: did the agent send all of it?
                code = ssh.wait(HANG_UP_SECONDS)
                if code != 0:
                    errors.seek(0)
                    said = explain(name, code, errors.read().decode(errors="replace"), self.options)
                    raise RemoteError(said.removeprefix(f"host {name}: "))

            assert ssh.stdout is not None
            stream = PipeStream(ssh.stdout, FINISH_SECONDS, FINISH_TOTAL_SECONDS, ended)
            received = delivery.receive(f"host {name}", stream, name in self._result_hosts)
            if ssh.poll() is None:
                ssh.kill()
        return received
