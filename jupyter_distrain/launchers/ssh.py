"""SSH launcher: the job's processes on other hosts, over OpenSSH with passwordless keys.

At submit (in the notebook) every host is checked in parallel (``preflight``): ssh
reaches it with a known host key, its Python imports this package and the backend's
libraries, and the address the connection arrived on names the interface the job
uses there (``--network-interface`` forces one). Nothing starts unless all pass.

Each process runs under one ssh connection that runs the remote agent
(:mod:`jupyter_distrain.remote`): the process's output comes back on the connection
into its log here; its pid, start time, memory and exit code come back as marked
lines; signals go the other way. The connection also forwards two Unix sockets on
the host to the supervisor's control and metrics sockets here (``ssh -R``), so the
channels never listen on a network and stay signed with the job's secret. A
connection that is lost (ssh's keepalives) fails the process here; the agent kills
the process tree on its host when its connection ends or goes silent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import ipaddress
import json
import logging
import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from ..cellcheck import uses_horovod_elastic
from ..contract import Env
from ..remote import CARRIED, COPIED, MARK
from ..spec import JobSpec, SpecError
from ..store import runtime_dir
from .base import LaunchedProcess, Launcher, ProcessSpec, Slot
from .hosts import parse_hosts
from .limits import thread_env
from .ssh_session import RemoteError, SshOptions, on_each

log = logging.getLogger(__name__)

REMOTE_ROOT = ".jupyter_distrain/jobs"  # under the remote user's home
PING_SECONDS = 2.0
FINISH_SECONDS = 30.0
EXIT_LOST = 255  # ssh's own exit code: the connection failed
HANG_UP_SECONDS = 5.0  # for ssh to end once its agent was told to


@dataclasses.dataclass(frozen=True)
class RemoteHost:
    """A host as the pre-flight found it."""

    name: str
    slots: int
    address: str  # where the other hosts reach it
    iface: str
    home: str
    driver: str  # where it reached us from (this machine's address on that network)
    ports: list[int]

    def directory(self, job_id: str, index: int) -> str:
        """The job's private directory on this host (distinct per host, even when
        hosts share a file system)."""
        return f"{self.home}/{REMOTE_ROOT}/{job_id}/host{index}"


def preflight(spec: JobSpec, processes: int, python: str) -> list[RemoteHost]:
    """Check every host in parallel; one :class:`SpecError` naming each that fails."""
    hosts = parse_hosts(spec.hosts)
    capacity = sum(h.slots for h in hosts)
    if processes > capacity:
        raise SpecError(
            f"--hosts offer {capacity} slots; the job needs {processes} processes "
            f"(--workers {spec.workers}" + (f" --ps {spec.ps})" if spec.ps else ")")
        )
    options = SshOptions.of(spec, python)
    args = ["preflight", "--backend", spec.backend, "--interface", spec.network_interface]

    def check(name: str) -> dict[str, Any]:
        slots = next(h.slots for h in hosts if h.name == name)
        out = options.run(name, [*args, "--ports", str(slots + 2)], timeout=spec.timeout)
        try:
            return json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"host {name}: the agent answered {out[:200]!r}") from None

    found = on_each([h.name for h in hosts], check)
    problems = [str(f) for f in found if isinstance(f, RemoteError)]
    for host, info in zip(hosts, found, strict=True):
        if isinstance(info, RemoteError):
            continue
        if not info["backend_ok"]:
            problems.append(f"host {host.name}: backend {spec.backend}: {info['backend_why']}")
        elif not info.get("address"):
            where = spec.network_interface or "the interface ssh arrived on"
            problems.append(f"host {host.name}: no IPv4 address on {where}")
        elif spec.backend == "horovod" and len(hosts) > 1 and not _routable(info["name_address"]):
            problems.append(
                f"host {host.name}: its name {info['name']!r} resolves to "
                f"{info['name_address'] or 'nothing'}, which other hosts cannot reach; "
                "Horovod's Gloo listens there (map the name to the host's address in its "
                "/etc/hosts or DNS)"
            )
    if problems:
        raise SpecError("--hosts: " + "; ".join(problems))
    return [
        RemoteHost(
            h.name, h.slots, i["address"], i["iface"], i["home"], i["driver"], i.get("ports", [])
        )
        for h, i in zip(hosts, found, strict=True)
        if isinstance(i, dict)
    ]


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
    """One process on a host, run by the agent under its own ssh connection."""

    def __init__(self, popen: subprocess.Popen[bytes], host: str, log_path: Path):
        self.popen = popen
        self.host = host
        self.log_path = log_path
        self.pid = 0
        self.rss = 0
        self.exit_code: int | None = None
        self.errors: list[str] = []  # what ssh itself said
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.startswith(MARK):
                self.errors.append(line)
                continue
            report = json.loads(line[len(MARK) :])
            if "pid" in report:
                self.pid, self.create_time = report["pid"], report["create_time"]
            self.rss = report.get("rss", self.rss)
            if "exit" in report:
                self.exit_code = report["exit"]

    def send(self, line: str) -> None:
        """A command for the agent (``signal``, ``ping``); ignored once the link is gone."""
        assert self.popen.stdin is not None
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            self.popen.stdin.write(line.encode() + b"\n")
            self.popen.stdin.flush()

    def _code(self) -> int:
        self._reader.join(timeout=5)
        if self.exit_code is not None:
            return self.exit_code
        self._note_lost()
        return EXIT_LOST

    def _note_lost(self) -> None:
        """Say in the process's log why it ended without an exit code: the connection."""
        if getattr(self, "_noted", False):
            return
        self._noted = True
        said = "; ".join(e for e in self.errors if e) or f"ssh exited with {self.popen.returncode}"
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
        self.send(f"signal {int(sig)} {int(tree)}")

    def memory_bytes(self) -> int:
        return self.rss

    def hang_up(self) -> None:
        """End the connection (the agent then kills whatever is left on its host)."""
        if self.popen.stdin is not None:
            with self._write_lock, contextlib.suppress(OSError):
                self.popen.stdin.close()

    def wait_closed(self, seconds: float) -> None:
        """Wait for ssh to end after :meth:`hang_up`; kill it when it does not."""
        try:
            self.popen.wait(seconds)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class SshLauncher(Launcher):
    """Places slots on ``--hosts`` in order, filling each host's slots first."""

    name = "ssh"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._control_dir = _control_dir()
        self.options = dataclasses.replace(
            SshOptions.of(self.spec, sys.executable),
            control_path=f"{self._control_dir}/%C" if self._control_dir else "",
        )
        self.hosts = [RemoteHost(**h) for h in self.spec.placement]
        self._free_ports = {h.name: list(h.ports) for h in self.hosts}
        self._unpacked: set[str] = set()
        self._processes: list[SshProcess] = []
        self._starts = 0
        self._closed = threading.Event()
        self._pinger = threading.Thread(target=self._ping, daemon=True)
        self._pinger.start()

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        if spec.controller == "mpi":
            raise SpecError("--controller mpi is not supported by --launcher ssh yet: use gloo")
        if spec.gpus:
            raise SpecError("--gpus is not supported by --launcher ssh yet")
        if spec.backend == "horovod" and uses_horovod_elastic(spec.code):
            raise SpecError(
                "Horovod elastic is not supported by --launcher ssh yet: its rendezvous "
                "server would take (and unpickle) requests from any host on the network"
            )
        if not spec.hosts:
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

    def _host(self, name: str) -> tuple[int, RemoteHost]:
        for index, host in enumerate(self.hosts):
            if host.name == name:
                return index, host
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
        return slots

    def _unpack(self, name: str) -> None:
        self.options.open_master(name, timeout=self.spec.timeout)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for entry in (*COPIED, *CARRIED):
                if (self.job.path / entry).exists():
                    tar.add(self.job.path / entry, entry)
        self.options.run(name, ["unpack", self._directory(name)], buffer.getvalue())
        self._unpacked.add(name)

    def _directory(self, name: str) -> str:
        index, host = self._host(name)
        return host.directory(self.job.id, index)

    def driver_address(self) -> str:
        return self.hosts[0].driver

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        try:
            return [self._free_ports[slot.host].pop(0) for slot in slots]
        except IndexError:
            raise RuntimeError("the pre-flight reserved too few ports") from None

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        assert proc.slot is not None, "every process of an ssh job has a slot"
        name = proc.slot.host
        directory = self._directory(name)
        self._starts += 1
        forwards, remote_env = [], {}
        for key, scheme in ((Env.CONTROL, "unix:"), (Env.METRICS, "ipc://")):
            local = proc.env[key].removeprefix(scheme)
            remote = f"{directory}/{proc.id}-{self._starts}-{key.rsplit('_', 1)[1].lower()}.sock"
            forwards += ["-R", f"{remote}:{local}"]
            remote_env[key] = scheme + remote
        env = {**thread_env(self.spec.cpu), **self.spec.env, **proc.env, **remote_env}
        env[Env.JOB_DIR] = directory
        argv = list(proc.argv)
        if argv and argv[0] == (self.spec.python or sys.executable):
            argv[0] = self.options.python
        request = {"argv": argv, "env": env, "sockets": [f.split(":")[0] for f in forwards[1::2]]}
        with open(log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                self.options.ssh_argv(name, self.options.agent("run", directory), *forwards),
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        handle = SshProcess(popen, name, log_path)
        handle.send(json.dumps(request))
        self._processes.append(handle)
        return handle  # not waiting for its pid: the next start's ssh connects meanwhile

    def _ping(self) -> None:
        while not self._closed.wait(PING_SECONDS):
            for handle in list(self._processes):
                if handle.popen.poll() is None:
                    handle.send("ping")

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        return None  # every process of an ssh job is started by this launcher

    def sweep(self) -> None:
        for handle in self._processes:
            handle.hang_up()
        deadline = time.monotonic() + HANG_UP_SECONDS
        for handle in self._processes:
            handle.wait_closed(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._closed.set()
        self.sweep()
        failures = [r for r in on_each(sorted(self._unpacked), self._finish) if r is not None]
        for failure in failures:
            log.warning("%s", failure)
        on_each([h.name for h in self.hosts], self.options.close_master)
        self._unpacked.clear()
        if self._control_dir:
            shutil.rmtree(self._control_dir, ignore_errors=True)

    def _finish(self, name: str) -> None:
        """Bring back what the job produced on ``name`` (its result, checkpoints) and
        remove the job's directory there."""
        data = self.options.run(name, ["finish", self._directory(name)], timeout=FINISH_SECONDS)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(self.job.path, filter="data")
