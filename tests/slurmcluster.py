"""A real Slurm cluster on this machine for the Slurm launcher's tests.

Debian's own daemons, started here and never as services: one ``munged`` (its key,
socket and state in the cluster's directory), one ``slurmctld`` on the notebook's side
of a bridge of its own (``jdslurm0``, 10.234.0.1, host name ``jdslurmctl``) and two
``slurmd`` "nodes", each in a network namespace behind the bridge with its own host
name resolving to its address (:func:`multihost.as_host`), so the job's ranks really
talk across a network. The configuration needs neither systemd nor cgroups
(``proctrack/linuxproc``, ``task/none``, no accounting). Every Slurm command of a test
(and of the launcher it runs) finds the cluster through ``SLURM_CONF``, which
:func:`slurm_cluster` sets while the cluster is up.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from multihost import (
    add_bridge,
    add_namespace,
    as_host,
    kill_inside,
    namespace_pids,
    remove_bridge,
    remove_namespace,
)

BRIDGE = "jdslurm0"
CONTROLLER = "jdslurmctl"
CONTROLLER_ADDRESS = "10.234.0.1"
NODE_CPUS = 2
NODE_MEMORY_MB = 1000
PARTITION = "jdtest"
START_SECONDS = 30.0
DAEMONS = ("slurmd", "slurmstepd")  # what a node runs of its own, besides a job's processes
# ``ip netns exec`` gives a node a /sys without cgroups, and Debian's slurmd (22.05) will not
# start unless its cgroup plugin finds a cgroup file system there (autodetected: v1 with a
# "systemd" hierarchy), though no plugin configured here uses one: an empty, private named
# hierarchy in the node's own mount namespace satisfies it; nothing is ever put in it
CGROUP_STUB = (
    "mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o none,name=jdslurm cgroup /sys/fs/cgroup/systemd"
)


@dataclass
class SlurmNode:
    """One slurmd: its host name (and network namespace) and address."""

    name: str
    address: str
    process: subprocess.Popen[bytes] | None = None

    def job_processes(self) -> list[psutil.Process]:
        """The live processes in this node's namespace other than Slurm's own daemons
        (and the namespace wrappers that started slurmd): what a job left there."""
        found = []
        for pid in namespace_pids(self.name):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and proc.name() not in DAEMONS:
                    found.append(proc)
        return found

    def listening(self) -> list[str]:
        """What listens on TCP in this node's namespace: "PROCESS ADDRESS:PORT" each."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.name, "ss", "--listening", "--tcp", "--numeric"]
            + ["--processes", "--no-header"],
            capture_output=True,
            text=True,
        )
        found = []
        for line in done.stdout.splitlines():
            fields = line.split()
            name = fields[-1].split('"')[1] if '"' in fields[-1] else "?"
            found.append(f"{name} {fields[3]}")
        return found

    def start(self, base: Path, conf: Path) -> None:
        """Start this node's slurmd in its namespace, as its host."""
        hosts = _hosts_file(base / self.name / "hosts", self.name, self.address)
        slurmd = ["slurmd", "-D", "-f", str(conf)]
        self.process = _start(
            as_host(
                self.name,
                self.name,
                hosts,
                ["sh", "-c", f'{CGROUP_STUB} && exec "$@"', "sh", *slurmd],
            ),
            base / self.name / "slurmd.out",
            {**os.environ, "SLURM_CONF": str(conf)},
        )

    def stop(self) -> None:
        """Kill this node's slurmd (and every process it started)."""
        if self.process is not None:
            _kill_tree(self.process)
            self.process = None

    def lose(self) -> None:
        """The node is lost: every process in its namespace killed at once, slurmd, its
        step daemons and the job's tasks (as when the machine goes down)."""
        kill_inside(self.name)
        self.stop()


@dataclass
class SlurmCluster:
    base: Path
    conf: Path
    nodes: list[SlurmNode]
    partition: str = PARTITION

    def env(self) -> dict[str, str]:
        """The environment a Slurm command needs to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm command (srun, squeue, scontrol, ...) against this cluster."""
        return subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=timeout)

    def queue(self) -> list[str]:
        """The cluster's jobs (``squeue``): one "ID STATE" line each."""
        done = self.run("squeue", "--noheader", "--format=%i %T")
        return done.stdout.split("\n")[:-1] if done.returncode == 0 else [done.stderr]

    def node(self, name: str) -> SlurmNode:
        return next(n for n in self.nodes if n.name == name)

    def idle(self) -> bool:
        """Whether every node of the partition is up and idle."""
        done = self.run("sinfo", "--noheader", "--format=%t", "--partition", self.partition)
        return done.returncode == 0 and done.stdout.split() == ["idle"]

    def restart(self, node: SlurmNode) -> None:
        """Start a lost node's slurmd again and wait until the partition is idle."""
        node.start(self.base, self.conf)
        try:
            _wait(f"slurmd on {node.name}", self.idle, self.base / node.name / "slurmd.log")
        except RuntimeError as exc:
            said = self.run("sinfo", "--Node", "--noheader", "--format=%N %T %E").stdout
            raise RuntimeError(f"{exc}; sinfo: {said}; squeue: {self.queue()}") from None

    def options(self, **extra: object) -> dict[str, object]:
        """JobSpec fields for a job on this cluster."""
        return {"launcher": "slurm", "slurm_partition": self.partition, **extra}

    def flags(self) -> str:
        return f"--launcher slurm --partition {self.partition}"


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(process.pid)
        members = [root, *root.children(recursive=True)]
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(members, timeout=5)
    process.wait()


def _config(base: Path, port: int, nodes: list[SlurmNode]) -> str:
    lines = [
        "ClusterName=jdtest",
        f"SlurmctldHost={CONTROLLER}({CONTROLLER_ADDRESS})",
        f"SlurmctldPort={port}",
        "SlurmdPort=6818",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base}/munge/munge.socket",
        f"StateSaveLocation={base}/ctld",
        f"SlurmctldPidFile={base}/ctld/slurmctld.pid",
        f"SlurmctldLogFile={base}/slurmctld.log",
        f"SlurmdSpoolDir={base}/%n/spool",
        f"SlurmdPidFile={base}/%n/slurmd.pid",
        f"SlurmdLogFile={base}/%n/slurmd.log",
        "SlurmdParameters=config_overrides",
        # no systemd, no cgroups: processes tracked by their parents, no task binding
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "KillWait=2",
        "MinJobAge=2",
        "InactiveLimit=0",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *(
            f"NodeName={n.name} NodeAddr={n.address} CPUs={NODE_CPUS} "
            f"RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
            for n in nodes
        ),
        f"PartitionName={PARTITION} Nodes={','.join(n.name for n in nodes)} Default=YES "
        "MaxTime=INFINITE State=UP",
        "",
    ]
    return "\n".join(lines)


def _wait(what: str, ready: Callable[[], bool], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            said = log.read_text()[-2000:] if log.exists() else "(no log)"
            raise RuntimeError(f"{what} did not start: {said}")
        time.sleep(0.1)


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def _hosts_file(path: Path, name: str, address: str) -> Path:
    path.write_text(f"127.0.0.1 localhost\n{address} {name}\n")
    return path


@contextlib.contextmanager
def slurm_cluster(base: Path, count: int = 2) -> Iterator[SlurmCluster]:
    """munged, slurmctld and ``count`` slurmd nodes ``jdsn1..`` at 10.234.0.11.. (see
    the module docstring); ``SLURM_CONF`` names the cluster's configuration meanwhile."""
    base.mkdir(parents=True, exist_ok=True)
    munge_dir = base / "munge"
    munge_dir.mkdir(mode=0o700)
    key = munge_dir / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    (base / "ctld").mkdir(mode=0o700)
    nodes = [SlurmNode(f"jdsn{i}", f"10.234.0.{10 + i}") for i in range(1, count + 1)]
    for node in nodes:
        (base / node.name / "spool").mkdir(parents=True, mode=0o700)
    conf = base / "slurm.conf"
    conf.write_text(_config(base, 6817, nodes))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = controller = None
    made_bridge = False
    made: list[SlurmNode] = []
    kept_conf = os.environ.get("SLURM_CONF")
    try:
        munged = _start(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge_dir}/munge.socket",
                f"--pid-file={munge_dir}/munged.pid",
                f"--log-file={munge_dir}/munged.log",
                f"--seed-file={munge_dir}/munged.seed",
            ],
            base / "munged.out",
            env,
        )
        _wait("munged", lambda: (munge_dir / "munge.socket").exists(), base / "munged.out")
        add_bridge(BRIDGE, CONTROLLER_ADDRESS)
        made_bridge = True
        started = time.monotonic()
        hosts = _hosts_file(base / "hosts", CONTROLLER, CONTROLLER_ADDRESS)
        controller = _start(
            as_host(None, CONTROLLER, hosts, ["slurmctld", "-D", "-i", "-f", str(conf)]),
            base / "slurmctld.out",
            env,
        )
        for node in nodes:
            add_namespace(node.name, node.address, BRIDGE)
            made.append(node)
            node.start(base, conf)
        os.environ["SLURM_CONF"] = str(conf)
        cluster = SlurmCluster(base, conf, nodes)

        _wait("the Slurm cluster", cluster.idle, base / "slurmctld.log")
        print(f"Slurm cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield cluster
    finally:
        if kept_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = kept_conf
        for node in made:
            node.stop()
            remove_namespace(node.name)
        for daemon in (controller, munged):
            if daemon is not None:
                _kill_tree(daemon)
        if made_bridge:
            remove_bridge(BRIDGE)
        shutil.rmtree(base, ignore_errors=True)
