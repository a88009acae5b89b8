"""The ssh launcher's pre-flight, at submit in the notebook: every host checked in
parallel (ssh reaches it with a known host key, its agent speaks this version's
protocol, its Python imports this package and the backend's libraries, the address the
connection arrived on names the interface the job uses there, the job's socket paths
fit); what it finds is a :class:`RemoteHost` per host, stored in the spec's placement.
It goes over the host's kept master connection (:mod:`.kept`), and a host checked over
the master that still runs, with the same options and backend, is not checked again.
Free ports and the sweep of what ended jobs left come with each job's files instead
(the agent's ``unpack``)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from typing import Any

from ...contract.spec import JobSpec, SpecError
from ..agent.client import other_version
from ..agent.files import JOBS_ROOT, socket_name, sockets_dir
from ..agent.host import PROTOCOL
from .connection import RemoteError, SshOptions, agent_answer, on_each
from .hosts import parse_hosts
from .kept import kept, recall, remember

REMOTE_ROOT = JOBS_ROOT  # under the remote user's home
# what argparse says when an agent of another version does not know a command or option
_USAGE_RE = re.compile(r": error: (argument |unrecognized arguments|the following arguments)")

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
    hostname: str = ""  # the host's own name
    network: str = ""  # the address's network, CIDR
    orted: str = ""  # OpenMPI's daemon there, if any

    def directory(self, job_id: str) -> str:
        """The job's private directory on this host, named by the host's own name (so
        distinct even when hosts share a file system, and the same template for all)."""
        return f"{self.home}/{REMOTE_ROOT}/{job_id}/{self.hostname}"

    def socket(self, job_id: str, start: int, channel: str) -> str:
        """Where the launcher's ``start``-th process of job ``job_id`` finds the
        supervisor's ``channel`` ("control", "metrics") on this host: a socket ssh
        forwards there (``-R``), in the host's sockets directory (it exists before the
        job's own directory does)."""
        return f"{sockets_dir(self.home, self.hostname)}/{socket_name(job_id, start, channel)}"

    def guard_socket(self, job_id: str, channel: str) -> str:
        """Where mpirun's ranks on this host find the supervisor's ``channel``: forwarded
        by the host's guard session into the job's directory."""
        return f"{self.directory(job_id)}/{channel}.sock"


def _socket_problem(spec: JobSpec, name: str, info: dict[str, Any]) -> str:
    """Why the job's sockets cannot be made on ``name`` (too long a path), or ""."""
    job_id = f"{spec.name}-{'0' * 6}"  # as long as JobDir.create's: the name, 6 hex digits
    host = RemoteHost(name, 1, "", "", info["home"], "", info["name"])
    paths = [host.socket(job_id, MOST_STARTS, "control")]
    if spec.uses_mpirun():
        paths.append(host.guard_socket(job_id, "control"))
    longest = max(paths, key=lambda p: len(p.encode()))
    if len(longest.encode()) <= MAX_SOCKET_BYTES:
        return ""
    return (
        f"host {name}: the job's sockets there ({os.path.dirname(longest)}/...) would have "
        f"paths of up to {len(longest.encode())} bytes, over the 108 a Unix socket's path "
        "may have (use a shorter --name)"
    )


def preflight(
    spec: JobSpec, given: dict[str, Any], processes: int, python: str
) -> list[RemoteHost]:
    """Check every host in parallel (``given``: the ssh launcher's options); one
    :class:`SpecError` naming each that fails."""
    hosts = parse_hosts(given["hosts"])
    capacity = sum(h.slots for h in hosts)
    if processes > capacity:
        raise SpecError(
            f"--hosts offer {capacity} slots; the job needs {processes} processes "
            f"(--workers {spec.workers}" + (f" --ps {spec.ps})" if spec.ps else ")")
        )
    options = kept(SshOptions.of(given, spec.python or python))
    interface = given["network_interface"]
    args = ["preflight", "--backend", spec.backend, "--interface", interface]
    key = f"{spec.backend} {interface}"
    opened: list[str] = []  # hosts this pre-flight opened a connection to

    def check(name: str) -> dict[str, Any]:
        remembered = recall(options, name, key)
        if remembered is not None and remembered.get("protocol") == PROTOCOL:
            return remembered  # checked by this version's agent over the master that runs
        if options.open_master(name, timeout=spec.timeout):
            opened.append(name)
        try:
            out = options.run(name, args, timeout=spec.timeout)
        except RemoteError as exc:
            if _USAGE_RE.search(str(exc)):  # an older agent: it knows no such option
                raise RemoteError(other_version(f"host {name}", {})) from None
            raise
        info = agent_answer(name, out)
        if not isinstance(info, dict) or info.get("protocol") != PROTOCOL:
            raise RemoteError(other_version(f"host {name}", info if isinstance(info, dict) else {}))
        return info

    found = on_each([h.name for h in hosts], check)
    problems = [str(f) for f in found if isinstance(f, RemoteError)]
    checked = [(h, i) for h, i in zip(hosts, found, strict=True) if isinstance(i, dict)]
    for host, info in checked:
        found_here = _problems(spec, given, host.name, info, len(hosts))
        if not found_here:  # a host refused is asked again (it may be fixed by then)
            remember(options, host.name, key, info)
        problems += found_here
    versions = {h.name: i.get("framework_version") for h, i in checked if i.get("backend_ok")}
    if len(set(versions.values())) > 1:
        each = ", ".join(f"{name} {version}" for name, version in versions.items())
        problems.append(f"{spec.backend} is not the same version on every host ({each})")
    names = [info["name"] for _, info in checked]
    for host, info in checked:
        if names.count(info["name"]) > 1:
            problems.append(f"host {host.name}: another host has its name {info['name']!r}")
    if problems:  # refused: nothing of this submit stays, its new connections neither
        on_each(opened, options.close_master)
        raise SpecError("--hosts: " + "; ".join(problems))
    return [
        RemoteHost(
            h.name,
            h.slots,
            i["address"],
            i["iface"],
            i["home"],
            i["driver"],
            i["name"],
            i.get("network", ""),
            i.get("orted", ""),
        )
        for h, i in checked
    ]


def _problems(
    spec: JobSpec, given: dict[str, Any], name: str, info: dict[str, Any], hosts: int
) -> list[str]:
    """What stops ``name`` (as its pre-flight found it) from running the job."""
    if not info["backend_ok"]:
        return [f"host {name}: backend {spec.backend}: {info['backend_why']}"]
    too_long = _socket_problem(spec, name, info)
    if too_long:
        return [too_long]
    if not info.get("address"):
        where = given["network_interface"] or "the interface ssh arrived on"
        return [f"host {name}: no IPv4 address on {where}"]
    if hosts == 1:
        return []
    if spec.uses_mpirun() and not info.get("orted"):
        return [f"host {name}: mpirun needs OpenMPI there (no orted on its PATH)"]
    horovod_gloo = spec.backend == "horovod" and spec.controller == "gloo"
    if horovod_gloo and not _routable(info["name_address"]):
        return [
            f"host {name}: its name {info['name']!r} resolves to "
            f"{info['name_address'] or 'nothing'}, which other hosts cannot reach; Horovod's "
            "Gloo listens there (map the name to the host's address in its /etc/hosts or DNS)"
        ]
    return []


def _routable(address: str) -> bool:
    try:
        return not ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
