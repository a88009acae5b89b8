"""A real two-node Ray cluster on this machine for the Ray launcher's tests.

The head runs in this network namespace on a bridge of its own (``jdray0``,
10.233.0.1), the second node in a network namespace behind it (10.233.0.11); each
has its own host name (a UTS namespace) resolving to its address (a private
/etc/hosts), as on real hosts: Horovod's Gloo binds some of its contexts to the
address the host name has. Each node has one CPU, so a job of two one-CPU slots
must use both.

What DESIGN.md measured is followed: usage stats off and their report sent nowhere
(port 9 on loopback), each node's HOME holding a stub ``ray_bootstrap_config.yaml``
(without it the dashboard probes cloud metadata addresses), and ``ray stop`` is never
run (it kills every Ray process on the machine by name): each node runs under
``ray start --block`` in a cgroup of its own (the v1 ``pids`` hierarchy) and is
stopped by killing every process in it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

BRIDGE = "jdray0"
HEAD_ADDRESS = "10.233.0.1"
RAY = str(Path(sys.executable).with_name("ray"))
CGROUPS = Path("/sys/fs/cgroup/pids")  # a node's processes are those in its cgroup
QUIET_RAY = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}
START_SECONDS = 60.0


@dataclass
class RayNode:
    """One node: its name (host name, and network namespace unless it is the head)."""

    name: str
    address: str
    home: Path
    netns: str | None = None
    cgroup: Path = field(default_factory=lambda: CGROUPS / f"jdray-{secrets.token_hex(4)}")
    process: subprocess.Popen[bytes] | None = None

    def start(self, ray_args: list[str], log: Path) -> None:
        """``ray start --block`` with this node's name, address and HOME."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n")
        hosts_file = self.home / "hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{self.address} {self.name}\n")
        self.cgroup.mkdir()
        env = {**os.environ, **QUIET_RAY, "HOME": str(self.home)}
        command = [RAY, "start", "--block", "--node-ip-address", self.address, *ray_args]
        script = f'hostname {self.name} && mount --bind {hosts_file} /etc/hosts && exec "$@"'
        argv = ["unshare", "--uts", "--mount", "sh", "-c", script, "sh", *command]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        # into the cgroup first: ``ip netns exec`` mounts a /sys without it
        argv = ["sh", "-c", f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
        with open(log, "ab") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def processes(self) -> list[psutil.Process]:
        """Every live process this node started: those in its cgroup. (Neither a marker
        in the environment nor the process tree finds them all: Ray's agents write their
        titles over their environment, and are orphaned when the raylet dies first.)"""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(int(pid))
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
        return found

    def kill(self) -> None:
        """Kill every process of this node (never ``ray stop``), then remove its cgroup."""
        deadline = time.monotonic() + 20
        while (left := self.processes()) and time.monotonic() < deadline:
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(left, timeout=2)
        if self.process is not None:
            self.process.wait()
        deadline = time.monotonic() + 5
        while self.cgroup.exists():  # emptied once its orphans are reaped (by init)
            try:
                self.cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@dataclass
class RayCluster:
    head: RayNode
    nodes: list[RayNode]
    gcs_address: str

    @property
    def all_nodes(self) -> list[RayNode]:
        return [self.head, *self.nodes]

    def options(self) -> dict[str, object]:
        """JobSpec fields for a job on this cluster."""
        return {"launcher": "ray", "ray_address": self.gcs_address}

    def flags(self) -> str:
        return f"--launcher ray --address {self.gcs_address}"


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _alive_nodes(gcs_address: str) -> int:
    """How many nodes the cluster counts as alive (asked in a separate process)."""
    code = (
        "import ray, sys\n"
        "ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR')\n"
        "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, gcs_address],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **QUIET_RAY},
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines else 0


def _wait_for_port(address: str, port: int, node: RayNode, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.5):
            return
        if node.process is not None and node.process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the Ray head did not start: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def ray_cluster(base: Path, cpus: int = 1) -> Iterator[RayCluster]:
    """A head and one more node, each with ``cpus`` CPUs, behind the bridge."""
    base.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(f"/tmp/jdray-{secrets.token_hex(3)}")  # short: Unix socket paths
    log = base / "ray.log"
    head = RayNode("jdray-head", HEAD_ADDRESS, base / "head")
    node = RayNode("jdray-n1", "10.233.0.11", base / "n1", netns="jdray1")
    made_bridge = made_netns = False
    try:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", BRIDGE)
        _ip("link", "add", BRIDGE, "type", "bridge")
        made_bridge = True
        _ip("addr", "add", f"{HEAD_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", "jdray1")
        _ip("netns", "add", "jdray1")
        made_netns = True
        _ip("link", "add", "vjdray1", "type", "veth", "peer", "name", "jdeth0", "netns", "jdray1")
        _ip("link", "set", "vjdray1", "master", BRIDGE, "up")
        _ip("-n", "jdray1", "addr", "add", f"{node.address}/24", "dev", "jdeth0")
        _ip("-n", "jdray1", "link", "set", "jdeth0", "up")
        _ip("-n", "jdray1", "link", "set", "lo", "up")
        port = _free_port(HEAD_ADDRESS)
        gcs_address = f"{HEAD_ADDRESS}:{port}"
        started = time.monotonic()
        head.start(
            [
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                str(cpus),
                "--temp-dir",
                str(temp_dir),
                "--dashboard-host",
                HEAD_ADDRESS,
                "--dashboard-port",
                str(_free_port(HEAD_ADDRESS)),
                "--ray-client-server-port",
                str(_free_port(HEAD_ADDRESS)),
            ],
            log,
        )
        _wait_for_port(HEAD_ADDRESS, port, head, log)
        node.start(["--address", gcs_address, "--num-cpus", str(cpus)], log)
        deadline = time.monotonic() + START_SECONDS
        while _alive_nodes(gcs_address) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the second Ray node did not join: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        print(f"Ray cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield RayCluster(head, [node], gcs_address)
    finally:
        for each in (node, head):
            each.kill()
        if made_netns:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", "jdray1")
        if made_bridge:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", BRIDGE)
        shutil.rmtree(temp_dir, ignore_errors=True)
