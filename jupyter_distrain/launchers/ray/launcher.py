"""Ray launcher: the job's processes on the nodes of a Ray cluster, through Ray Core.

At submit a pre-flight (:mod:`.probe`, in a process of its own, cut off at
``--timeout``) connects to ``--address`` (default: a running Ray if there is one,
else the job starts a local one) and checks that the cluster's nodes could hold the
job's slots at all; nothing starts otherwise.

The supervisor is the Ray driver. Each generation asks for one placement group of
one bundle per slot (``--cpu`` CPUs, ``--memory`` GiB), so all slots start or none;
one that cannot be placed within ``--timeout`` is removed and the job fails naming
what the cluster lacked. Each slot is a :class:`~.ray_node.SlotAgent` actor in its
bundle: it reports its node's IP, receives the job's files through the object store
into a private directory on its node, and runs its process there under the remote
agent. The supervisor reads each process's output back into the job's log here
(:class:`RayProcess`) and, at the end, brings back what the job produced (its
result, checkpoints), then kills the actors and removes the placement group.

The workers reach the supervisor's control and metrics channels over TCP, on the
address this machine has towards the cluster only (:meth:`RayKind.channel_host`);
both channels are signed with the job's secret and refuse replays.

A Ray the job starts for itself (no cluster running) is reachable from this machine
only: the supervisor first moves into a private network namespace with only loopback
up, as local jobs do (Ray binds its servers to every interface whatever address it is
given), the channels are the job's Unix sockets, and that Ray's session directory is a
private one of the job's, removed with the Ray when the job ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...contract.launch import MPIRUN, LaunchedProcess, ProcessSpec, Slot
from ...contract.private import runtime_dir
from ...contract.spec import JobSpec, SpecError
from ..agent.client import EXIT_LOST, handoff_of, job_files_archive, other_version
from ..agent.delivery import PulledStream, result_slots
from ..agent.host import PROTOCOL, route_source
from ..agent.pooled import pool_request
from ..base import Launcher, LauncherKind, LauncherOption
from ..isolation import private_network
from ..limits import thread_env
from ..remote.bring_back import Holder, bring_back
from .node import ROOT, SlotAgent
from .pools import cluster_pools
from .pools import remember as remember_cluster
from .probe import import_ray, recall_probe, remember_probe, run_driver

log = logging.getLogger(__name__)

GIB = 2**30
PUMP_SECONDS = 0.25  # how often an idle process's output is polled
CALL_SECONDS = 60.0  # the longest one call to an actor may take
NAMESPACE = "jupyter_distrain"
QUIET = {"RAY_USAGE_STATS_ENABLED": "0"}  # when this package starts a local Ray
LOOPBACK = "127.0.0.1"
LOCAL_STARTS = 3  # tries at starting a local Ray
# the longest path Ray gives a Unix socket under a local Ray's directory (a mkdtemp name,
# its sessions' root "r", a session named by time and a pid of up to 7 digits); Unix
# sockets' paths are at most 107 bytes
RAY_SOCKET_TAIL = len(
    "/jd-ray-xxxxxxxx/r/session_2026-12-07_19-35-17_920887_4194304/sockets/plasma_store"
)
SHORT_PATH = 107 - RAY_SOCKET_TAIL
PROBE_KEEP_SECONDS = 300.0  # how long a cluster that still answers is not probed again


def starts_local_ray(spec: JobSpec) -> bool:
    """Whether the job starts a Ray of its own (the pre-flight found none running)."""
    return bool(spec.placement) and not spec.placement[0].get("address")


class PlacementError(RuntimeError):
    """The cluster could not place the job's slots; the message names what it lacked."""


# --- resources ----------------------------------------------------------------------
def bundle_of(spec: JobSpec) -> dict[str, float]:
    """What one slot asks Ray for."""
    bundle = {"CPU": float(spec.cpu if spec.cpu is not None else 1.0)}
    if spec.memory is not None:
        bundle["memory"] = float(int(spec.memory * GIB))
    return bundle


def amount(key: str, value: float) -> str:
    if key == "memory":
        return f"{value / GIB:g} GiB memory"
    return f"{value:g} {key}"


def describe(bundle: dict[str, float]) -> str:
    return " and ".join(amount(k, v) for k, v in bundle.items())


def shortfall(bundle: dict[str, float], count: int, nodes: dict[str, dict[str, float]]) -> str:
    """Why ``count`` bundles do not fit in ``nodes`` (IP -> resources); "" when they do."""
    fits = sum(
        min(int(res.get(key, 0.0) / need + 1e-9) for key, need in bundle.items())
        for res in nodes.values()
    )
    if fits >= count:
        return ""
    reasons = []
    for key, need in bundle.items():
        have = [res.get(key, 0.0) for res in nodes.values()]
        if max(have, default=0.0) + 1e-9 < need:
            largest = amount(key, max(have, default=0.0))
            reasons.append(f"no node has {amount(key, need)} (the largest has {largest})")
        elif sum(int(h / need + 1e-9) for h in have) < count:
            listed = " + ".join(amount(key, h) for h in have)
            reasons.append(
                f"{count} slots need {amount(key, need * count)}, the nodes have {listed}"
            )
    if not reasons:
        reasons.append("no node has room for all of one slot's resources together")
    return f"{count} slots of {describe(bundle)}: " + "; ".join(reasons)


# --- the pre-flight -----------------------------------------------------------------
def preflight(spec: JobSpec, processes: int) -> dict[str, Any]:
    """Run :mod:`.probe` (cut off at ``--timeout``), or recall what it found for the
    same address in the last :data:`PROBE_KEEP_SECONDS` while that cluster still
    answers; what the supervisor needs: the cluster's address, and the address the
    cluster's nodes reach this machine on."""
    address = RayKind.option_values(spec)["ray_address"]
    python = spec.python or sys.executable
    key = json.dumps([address, os.environ.get("RAY_ADDRESS", ""), python])
    found = recall_probe(key, PROBE_KEEP_SECONDS)
    if found is None:
        found = _probe(spec, address, python)
        if found["address"]:  # "no running Ray" is asked again: one may start meanwhile
            remember_probe(key, found)
    if not found["address"]:  # no running Ray: the supervisor starts a local one
        return {"address": "", "driver": "127.0.0.1", "nodes": []}
    nodes = {n["address"]: n["resources"] for n in found["nodes"]}
    lacking = shortfall(bundle_of(spec), processes, nodes)
    if lacking:
        raise SpecError(f"--launcher ray: the cluster at {found['address']} cannot place {lacking}")
    host = found["address"].rpartition(":")[0]
    return {"address": found["address"], "driver": route_source(host), "nodes": sorted(nodes)}


def _probe(spec: JobSpec, address: str, python: str) -> dict[str, Any]:
    """What :mod:`.probe` found at ``address``; a :class:`SpecError` saying why not."""
    where = address or "a running Ray"
    try:
        found = run_driver("jupyter_distrain.launchers.ray.probe", [address], python, spec.timeout)
    except TimeoutError:
        raise SpecError(
            f"--address: the Ray cluster at {where} did not answer within "
            f"{spec.timeout:g} s (--timeout)"
        ) from None
    except RuntimeError as exc:
        raise SpecError(f"--address: the Ray pre-flight failed: {exc}") from None
    if "error" in found:
        raise SpecError(f"--address: {found['error']}")
    return found


# --- the driver ---------------------------------------------------------------------
def local_ray_root() -> Path:
    """A fresh private (0700) directory for a local Ray's sessions: in the per-user
    runtime directory, or, where that path is too long for Ray's sockets (systemd's
    ``/run/user/UID`` is), in the temporary directory, else ``/tmp``. Ray makes its root
    world-writable: it is ``r`` inside the private one."""
    fits = [p for p in (runtime_dir(), Path(tempfile.gettempdir())) if len(str(p)) <= SHORT_PATH]
    parent = fits[0] if fits else Path("/tmp")
    return Path(tempfile.mkdtemp(prefix="jd-ray-", dir=parent)) / "r"


def connect(address: str, root: Path | None = None) -> None:
    """Make this process a driver of the cluster at ``address`` ("": start a local Ray
    on loopback with its sessions under ``root``), once. Ray installs signal handlers
    of its own: the supervisor's are kept."""
    import ray

    if ray.is_initialized():
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    options: dict[str, Any] = {"log_to_driver": False, "namespace": NAMESPACE}
    if not address:
        for key, value in QUIET.items():
            os.environ.setdefault(key, value)
        options.update(include_dashboard=False, _node_ip_address=LOOPBACK)
        if root is not None:
            options["_temp_dir"] = str(root)
    try:
        for attempt in range(1 if address else LOCAL_STARTS):
            try:
                ray.init(address=address or None, logging_level=logging.WARNING, **options)
                break
            except Exception as exc:  # Ray gives its raylet a fixed 30 s to come up
                if attempt + 1 == LOCAL_STARTS or "timed out during startup" not in str(exc):
                    raise
                log.warning("the local Ray did not come up in time; starting it again")
                ray.shutdown()
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in kept.items():
                signal.signal(sig, handler)


class RayProcess(LaunchedProcess):
    """One process run by a slot's actor, from the actor's ``start`` call (``started``,
    not waited for: the generation's starts run on their actors at once). A thread
    learns its pid, start time and whether it was pooled when that call returns (the
    supervisor's row takes them then), then copies its output into the log here as it
    comes, and learns its memory and, last, its exit code."""

    own_job_dir = True  # the slot's directory on its node

    def __init__(self, actor: Any, host: str, log_path: Path, started: Any):
        self.actor = actor
        self.host = host
        self.log_path = log_path
        self.pid = 0  # until the actor says
        self.rss = 0
        self._started = started
        self._code: int | None = None
        self._lost = False  # the actor went away before the process's exit code came
        self._done = threading.Event()
        threading.Thread(target=self._pump, name=f"ray-log-{host}", daemon=True).start()

    def _learn_started(self, out: Any) -> bool:
        """Wait for the actor's start; whether the process runs (else the log says why)."""
        import ray

        try:
            started = ray.get(self._started, timeout=CALL_SECONDS)
        except Exception as exc:  # the actor could not start it, or is gone
            out.write(f"\njupyter_distrain: the Ray actor on {self.host} could not start ".encode())
            out.write(f"the process: {type(exc).__name__}: {exc}\n".encode())
            return False
        self.create_time = started["create_time"]
        self.pooled = bool(started.get("pooled"))  # from the node's warm pool
        self.pid = started["pid"]  # last: whoever sees the pid sees the rest
        return True

    def _pump(self) -> None:
        import ray

        offset = 0
        with open(self.log_path, "ab", buffering=0) as out:
            if not self._learn_started(out):
                self._code = EXIT_LOST
            while self._code is None:
                try:
                    report = ray.get(self.actor.pump.remote(offset), timeout=CALL_SECONDS)
                except Exception as exc:  # the actor or its node is gone
                    out.write(f"\njupyter_distrain: lost the Ray actor on {self.host}: ".encode())
                    out.write(f"{type(exc).__name__}\n".encode())
                    self._code = EXIT_LOST
                    self._lost = True
                    break
                out.write(report["data"])
                offset += len(report["data"])
                self.rss = report["rss"]
                self._code = report["exit"]
                if self._code is None and not report["data"]:
                    time.sleep(PUMP_SECONDS)
        self._done.set()

    def wait(self) -> int:
        self._done.wait()
        assert self._code is not None
        return self._code

    def poll(self) -> int | None:
        return self._code if self._done.is_set() else None

    def signal(self, sig: int, tree: bool = False) -> None:
        self.actor.signal.remote(int(sig), tree)

    def receive_files(self, files: dict[str, bytes]) -> None:
        self.actor.receive_files.remote(files)

    def host_lost(self) -> bool:
        return self._lost

    def memory_bytes(self) -> int:
        return self.rss


@dataclasses.dataclass
class SlotActor:
    """A slot's actor and where it landed."""

    handle: Any
    address: str
    iface: str


RAY_OPTIONS = (
    LauncherOption(
        "ray_address",
        str,
        "",
        "ray launcher: the Ray cluster (host:port or ray://...; default a running one, "
        "else a local one)",
        flag="--address",
        only_for="the Ray launcher",
    ),
)


class RayKind(LauncherKind):
    """What the Ray launcher is and checks at submit: its options, the cluster's
    pre-flight, its isolation (a local Ray in the job's network), the nodes' pools and its
    channels' address."""

    name = "ray"
    declared_options = RAY_OPTIONS
    supports = frozenset()
    why_not = {MPIRUN: " (no mpirun on Ray)"}

    @classmethod
    def preload(cls) -> None:
        """``import ray`` (~0.4 s; it starts no thread): a standby's next Ray job becomes
        a driver that much sooner."""
        import_ray()

    @classmethod
    def check_capacity(cls, spec: JobSpec, processes: int) -> JobSpec:
        return dataclasses.replace(spec, placement=[preflight(spec, processes)])

    @classmethod
    def notes(cls, spec: JobSpec) -> list[str]:
        cluster = spec.placement[0] if spec.placement else {}
        if not cluster.get("address"):
            return ["Ray: no running cluster found; the job starts a local one"]
        nodes = ", ".join(cluster.get("nodes", []))
        slot = describe(bundle_of(spec))
        return [f"Ray cluster at {cluster['address']}: nodes {nodes}; slots of {slot}"]

    @classmethod
    def isolate(cls) -> str | None:
        return "the ray launcher runs the job on the Ray cluster's nodes"

    @classmethod
    def isolate_job(cls, spec: JobSpec) -> str | None:
        """A job that starts its own Ray gets the private network namespace of a local
        job: that Ray, which binds every interface, is then reachable from here only."""
        return private_network() if starts_local_ray(spec) else cls.isolate()

    @classmethod
    def runs_on_other_hosts(cls, spec: JobSpec) -> bool:
        return not starts_local_ray(spec)

    @classmethod
    def remote_pools(cls, drain: bool = False) -> dict[str, Any]:
        return cluster_pools(drain)

    @classmethod
    def reachable_by(cls, spec: JobSpec) -> str:
        if starts_local_ray(spec):  # a local Ray binds every interface
            return "other users of this machine and other hosts"
        return "other hosts"

    @classmethod
    def channel_host(cls, spec: JobSpec) -> str | None:
        if starts_local_ray(spec):
            return None  # every process is on this machine, in the job's namespace
        cluster = spec.placement[0] if spec.placement else {}
        return cluster.get("driver", LOOPBACK)


class RayLauncher(Launcher):
    """Places every slot of a generation in one placement group (see the module docstring)."""

    kind = RayKind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cluster = self.spec.placement[0] if self.spec.placement else {}
        self.address: str = cluster.get(
            "address", self.kind.option_values(self.spec)["ray_address"]
        )
        self.driver: str = cluster.get("driver", LOOPBACK)
        self.local_root: Path | None = None  # the sessions of the Ray this job started
        self.group: Any = None
        self.actors: list[SlotActor] = []
        self._result_slots: set[int] = set()  # rank 0's: the result comes from it
        self._handoff: dict[str, str] = {}  # what every process is handed (read at place)
        self._pools_remembered = False

    # --- at submit -------------------------------------------------------------------
    # --- placing ---------------------------------------------------------------------
    def place(self, n: int) -> list[Slot]:
        ray = import_ray()  # the supervisor's first
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not self.address and self.local_root is None and not ray.is_initialized():
            self.local_root = local_ray_root()
        try:
            connect(self.address, self.local_root)
        except BaseException:
            self._stop_local_ray()
            raise
        bundle = bundle_of(self.spec)
        started = time.monotonic()
        self.group = placement_group(
            [dict(bundle) for _ in range(n)],
            strategy="PACK",
            name=f"jupyter_distrain-{self.job.id}",
        )
        ready, _ = ray.wait([self.group.ready()], timeout=self.spec.timeout)
        if not ready:
            free = {key: ray.available_resources().get(key, 0.0) for key in bundle}
            self._remove_group()
            needed = ", ".join(amount(k, v * n) for k, v in bundle.items())
            have = ", ".join(amount(k, v) for k, v in free.items())
            raise PlacementError(
                f"the Ray cluster could not place {n} slots of {describe(bundle)} within "
                f"{self.spec.timeout:g} s (--timeout): they need {needed}; free now: {have}"
            )
        log.info("placement group of %d slots ready in %.1f s", n, time.monotonic() - started)
        agent = ray.remote(SlotAgent)
        memory = bundle.get("memory")
        handles = [
            agent.options(
                num_cpus=bundle["CPU"],
                memory=memory,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, i),
            ).remote(self.job.id, i)
            for i in range(n)
        ]
        self.actors = [SlotActor(h, "", "") for h in handles]  # close() kills them, whatever
        infos = ray.get([h.describe.remote() for h in handles], timeout=self.spec.timeout)
        for info in infos:
            if info.get("protocol") != PROTOCOL:
                raise PlacementError(other_version(f"Ray node {info['hostname']}", info))
        files = ray.put(job_files_archive(self.job.path, in_memory=True))
        self._handoff = handoff_of(self.job.path)
        ray.get([h.unpack.remote(files) for h in handles], timeout=CALL_SECONDS)
        for actor, info in zip(self.actors, infos, strict=True):
            actor.address, actor.iface = info["address"], info["iface"]
        seen: Counter[str] = Counter()
        slots = []
        for index, actor in enumerate(self.actors):
            slots.append(
                Slot(actor.address, actor.address, index, seen[actor.address], actor.iface)
            )
            seen[actor.address] += 1
        log.info("slots on %s in %.1f s", dict(seen), time.monotonic() - started)
        return slots

    def driver_address(self) -> str:
        return self.driver

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        import ray

        wanted = Counter(slot.address for slot in slots)
        asked = {
            address: self._actor_on(address).handle.free_ports.remote(address, count)
            for address, count in wanted.items()
        }
        free = {address: ray.get(ref, timeout=CALL_SECONDS) for address, ref in asked.items()}
        return [free[slot.address].pop(0) for slot in slots]

    def _actor_on(self, address: str) -> SlotActor:
        return next(a for a in self.actors if a.address == address)

    # --- processes -------------------------------------------------------------------
    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        assert proc.slot is not None, "every process of a ray job has a slot"
        actor = self.actors[proc.slot.index]
        env = {**thread_env(self.spec.cpu), **self.spec.env, **proc.env}
        python = self.spec.python or sys.executable
        self._result_slots.update(slot.index for slot in result_slots(proc))
        request = {"argv": proc.argv, "env": env, "handoff": self._handoff}
        pool = pool_request(self.spec, proc.argv, env, self.run_id)
        if pool:  # from the node's warm pool, when it has one ready
            request["pool"] = pool
            if self.address and not self._pools_remembered:
                self._pools_remembered = True
                remember_cluster(self.address)  # for %distributed pool
        started = actor.handle.start.remote(request, str(proc.id), python)
        return RayProcess(actor.handle, actor.address, log_path, started)

    def adopt(self, pid: int, host: str) -> LaunchedProcess | None:
        return None  # every process of a ray job is started by this launcher

    def sweep(self) -> None:
        import ray

        if not self.actors:
            return  # (a Ray call with no Ray running would start one)
        calls = [a.handle.hang_up.remote() for a in self.actors]
        with contextlib.suppress(Exception):
            ray.get(calls, timeout=CALL_SECONDS)

    def close(self) -> None:
        """Bring back what the job produced (as :mod:`..agent.delivery` accepts it), then
        kill the actors, remove the group."""
        import ray

        bring_back(self.job.path, [self._holder(i) for i in range(len(self.actors))], self.warn)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        self.actors = []
        self._remove_group()
        self._stop_local_ray()

    def _stop_local_ray(self) -> None:
        """Stop the Ray this job started, and remove its session directory."""
        import ray

        if self.local_root is None:
            return
        with contextlib.suppress(Exception):
            ray.shutdown()
        shutil.rmtree(self.local_root.parent, ignore_errors=True)
        self.local_root = None

    def _holder(self, index: int) -> Holder:
        """Slot ``index``'s files, in chunks its actor reads out."""
        import ray

        actor = self.actors[index]

        @contextlib.contextmanager
        def archive() -> Iterator[PulledStream]:
            ray.get(actor.handle.send_open.remote(), timeout=CALL_SECONDS)
            yield PulledStream(
                lambda size: ray.get(actor.handle.send_read.remote(size), timeout=CALL_SECONDS)
            )

        def remove() -> None:
            ray.get(actor.handle.remove.remote(), timeout=CALL_SECONDS)

        source = f"slot {index} on {actor.address or 'its node'}"
        where = f"~/{ROOT}/{self.job.id}/slot{index}"
        return Holder(source, where, index in self._result_slots, archive, remove)

    def _remove_group(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None
