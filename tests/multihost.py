"""Real "hosts" on this machine for the multi-host tests: network namespaces behind a
bridge, each running Debian's own sshd on port 2222 with its own host key, reachable
with a generated key. Traffic stays on the bridge (10.232.0.0/24)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

BRIDGE = "jdbr0"
DRIVER_ADDRESS = "10.232.0.1"
SSH_PORT = 2222
SSHD = "/usr/sbin/sshd"


@dataclass
class SshHost:
    name: str  # the network namespace
    address: str
    config: Path
    host_key: Path
    sshd: subprocess.Popen[bytes] | None = None

    def start_sshd(self, name_address: str = "", hostname: str = "") -> None:
        """sshd in the host's network namespace, with the host's own name (a UTS
        namespace) resolving to its address (its own /etc/hosts), as on a real host:
        Horovod's Gloo binds some of its contexts to the address the host name has.
        ``name_address``: what the name resolves to instead (Debian's 127.0.1.1);
        ``hostname``: the host's name instead of its namespace's."""
        hosts_file = self.config.with_name("hosts")
        named = name_address or self.address
        hostname = hostname or self.name
        hosts_file.write_text(f"127.0.0.1 localhost\n{named} {hostname}\n")
        self.sshd = subprocess.Popen(
            as_host(self.name, hostname, hosts_file, [SSHD, "-D", "-e", "-f", str(self.config)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["ip", "netns", "exec", self.name, "ss", "-ltn", f"sport = :{SSH_PORT}"],
                capture_output=True,
                text=True,
            )
            if f":{SSH_PORT}" in probe.stdout:
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not start in {self.name}")

    def kill_sshd(self) -> None:
        """Kill this host's sshd and every session it serves (not the sessions' programs)."""
        if self.sshd is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.sshd.pid)
            daemons = [root, *root.children(recursive=True)]
            for proc in daemons:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if proc.name() in ("sshd", "ip", "unshare", "sh"):
                        proc.kill()
        self.sshd.wait()
        self.sshd = None

    def link(self, up: bool) -> None:
        veth = f"v{self.name}"
        subprocess.run(["ip", "link", "set", veth, "up" if up else "down"], check=True)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A command inside this host's namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True
        )


@dataclass
class SshCluster:
    hosts: list[SshHost]
    identity: Path
    known_hosts: Path

    def flags(self, slots: int = 1) -> str:
        hosts = ",".join(f"{h.address}:{slots}" for h in self.hosts)
        return (
            f"--launcher ssh --hosts {hosts} --ssh-port {SSH_PORT} "
            f"--ssh-identity {self.identity} --ssh-known-hosts {self.known_hosts}"
        )

    def options(self, slots: int = 1) -> dict[str, object]:
        """The same as JobSpec fields."""
        return {
            "launcher": "ssh",
            "hosts": ",".join(f"{h.address}:{slots}" for h in self.hosts),
            "ssh_port": SSH_PORT,
            "ssh_identity": str(self.identity),
            "ssh_known_hosts": str(self.known_hosts),
        }


def as_host(namespace: str | None, hostname: str, hosts_file: Path, argv: list[str]) -> list[str]:
    """``argv`` run as a host named ``hostname`` (a UTS namespace) whose ``/etc/hosts`` is
    ``hosts_file`` (a mount namespace), in network namespace ``namespace`` (None: this one)."""
    script = f'hostname {hostname} && mount --bind {hosts_file} /etc/hosts && exec "$@"'
    command = ["unshare", "--uts", "--mount", "sh", "-c", script, "sh", *argv]
    return ["ip", "netns", "exec", namespace, *command] if namespace else command


def namespace_pids(namespace: str) -> list[int]:
    """The processes in network namespace ``namespace``."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(pid) for pid in pids.stdout.split()]


def kill_inside(namespace: str) -> None:
    """SIGKILL every process in network namespace ``namespace``."""
    for pid in namespace_pids(namespace):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


def add_bridge(bridge: str, address: str) -> None:
    """A bridge ``bridge`` holding ``address``/24 here (one left by an earlier run replaced)."""
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("link", "del", bridge)
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"{address}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")


def remove_bridge(bridge: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("link", "del", bridge)


def add_namespace(name: str, address: str, bridge: str) -> None:
    """Network namespace ``name`` with ``address``/24 on its ``jdeth0``, behind ``bridge``
    (one left by an earlier run replaced)."""
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", name)
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("link", "del", f"v{name}")  # left by a run whose host outlived it
    _ip("netns", "add", name)
    _ip("link", "add", f"v{name}", "type", "veth", "peer", "name", "jdeth0", "netns", name)
    _ip("link", "set", f"v{name}", "master", bridge, "up")
    _ip("-n", name, "addr", "add", f"{address}/24", "dev", "jdeth0")
    _ip("-n", name, "link", "set", "jdeth0", "up")
    _ip("-n", name, "link", "set", "lo", "up")


def remove_namespace(name: str) -> None:
    """Kill what runs in network namespace ``name`` (it would keep it alive), delete it."""
    kill_inside(name)
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", name)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(host: SshHost, home: Path, authorized: Path) -> str:
    return "\n".join(
        [
            f"ListenAddress {host.address}:{SSH_PORT}",
            f"HostKey {host.host_key}",
            f"PidFile {home}/sshd.pid",
            # the tests' key (root's), and an account's own keys in its home
            f"AuthorizedKeysFile {authorized} .ssh/authorized_keys",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",  # the keys sit under a temporary directory
            "AllowStreamLocalForwarding yes",
            "AllowTcpForwarding yes",
            "X11Forwarding no",
            "LogLevel ERROR",
            "",
        ]
    )


@contextlib.contextmanager
def ssh_cluster(
    base: Path, count: int = 2, prefix: str = "jdh", bridge: str = BRIDGE
) -> Iterator[SshCluster]:
    """``count`` hosts named ``{prefix}1..`` at 10.232.0.11.. behind ``bridge`` (name it
    as the hosts' interface, ``jdeth0``, for horovodrun: it gives every host the driver's
    interface name)."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    base.mkdir(parents=True, exist_ok=True)
    identity = base / "id_ed25519"
    authorized = base / "authorized_keys"
    authorized.write_text(_keygen(identity) + "\n")
    known_hosts = base / "known_hosts"
    hosts = []
    made_bridge = False
    try:
        add_bridge(bridge, DRIVER_ADDRESS)
        made_bridge = True
        lines = []
        for i in range(1, count + 1):
            name = f"{prefix}{i}"
            home = base / name
            home.mkdir()
            host = SshHost(name, f"10.232.0.{10 + i}", home / "sshd_config", home / "host_key")
            hosts.append(host)
            key = _keygen(host.host_key)
            lines.append(f"[{host.address}]:{SSH_PORT} {' '.join(key.split()[:2])}")
            host.config.write_text(_sshd_config(host, home, authorized))
            add_namespace(name, host.address, bridge)
            host.start_sshd()
        known_hosts.write_text("\n".join(lines) + "\n")
        yield SshCluster(hosts, identity, known_hosts)
    finally:
        for host in hosts:
            host.kill_sshd()
            remove_namespace(host.name)
        if made_bridge:
            remove_bridge(bridge)
        shutil.rmtree(base, ignore_errors=True)
