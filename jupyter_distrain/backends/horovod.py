"""Horovod backend: ring allreduce over Gloo (default) or MPI (``--controller mpi``).

Gloo mode needs no horovodrun, no ssh and no MPI: the supervisor runs Horovod's
rendezvous server itself and gives every process the variables horovodrun
would have set. MPI mode runs one ``mpirun`` that starts every rank.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..contract.cellcheck import resizes_in_place
from ..contract.process import Env, ProcessId
from ..contract.store import ProcessRecord
from ..frameworks import horovod_missing_reason
from ..launchers.base import Launcher, ProcessSpec, Slot
from .base import Backend, Outcome, Plan, Services, WorkerCommand


def hosts_string(slots: list[Slot]) -> str:
    """Horovod's ``host:slots,...`` notation for the placed slots, in order."""
    counts = Counter(s.host for s in slots)
    return ",".join(f"{host}:{counts[host]}" for host in dict.fromkeys(s.host for s in slots))


def gloo_rank_env(slot: Slot, info: Any, address: str, port: int) -> dict[str, str]:
    """What horovodrun would give the process in ``slot`` with Horovod's ``SlotInfo``."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": slot.iface,
        "NCCL_SOCKET_IFNAME": slot.iface,
        "HOROVOD_HOSTNAME": info.hostname,
        "HOROVOD_RANK": str(info.rank),
        "HOROVOD_SIZE": str(info.size),
        "HOROVOD_LOCAL_RANK": str(info.local_rank),
        "HOROVOD_LOCAL_SIZE": str(info.local_size),
        "HOROVOD_CROSS_RANK": str(info.cross_rank),
        "HOROVOD_CROSS_SIZE": str(info.cross_size),
    }


def bound_rendezvous(address: str) -> Any:
    """Horovod's RendezvousServer, listening on ``address`` only (Horovod's own binds
    every interface, and its elastic handler unpickles what it is sent)."""
    from horovod.runner.http.http_server import (
        RendezvousHandler,
        RendezvousHTTPServer,
        RendezvousServer,
    )
    from horovod.runner.util.threads import in_thread

    class BoundRendezvousServer(RendezvousServer):
        def start(self, handler_cls: Any = RendezvousHandler) -> int:
            self._httpd = RendezvousHTTPServer((address, 0), handler_cls, self._verbose)
            self._listen_thread = in_thread(target=self._httpd.serve_forever)
            return self._httpd.server_address[1]

    return BoundRendezvousServer(verbose=0)


def rendezvous_ports(address: str, port: int) -> dict[str, list[int]]:
    """The rendezvous port as a port other hosts can reach: none when it listens on
    loopback (the local launcher, a local Ray)."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name
        loopback = False
    return {} if loopback else {"Horovod rendezvous": [port]}


class RendezvousService(Services):
    """Horovod's rendezvous server, run in the supervisor for one Gloo job."""

    def __init__(self, plan: list[Any], address: str):
        self.server = bound_rendezvous(address)
        self.port = self.server.start()
        self.server.init(plan)

    def stop(self) -> None:
        self.server.stop()


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.elastic = resizes_in_place(self.spec)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        spec = importlib.util.find_spec("horovod")
        if spec is None or not spec.submodule_search_locations:
            return False, horovod_missing_reason()
        # horovod.tensorflow imports only when its compiled library was built
        libs = Path(spec.submodule_search_locations[0], "tensorflow").glob("mpi_lib*.so")
        if not any(libs):
            return False, "horovod was built without TensorFlow support"
        return True, "horovod is installed with TensorFlow support"

    def prepare(self, slots: list[Slot], launcher: Launcher, worker: WorkerCommand) -> Plan:
        if self.spec.controller == "mpi":
            return Plan([mpirun_process(slots, worker, self.spec.env)])
        address = launcher.driver_address()
        if self.elastic:
            from .horovod_elastic import ElasticRun

            run = ElasticRun(slots, address, worker, timeout=int(self.spec.timeout))
            # its driver starts the processes
            return Plan([], services=run, ports=rendezvous_ports(address, run.port))
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

        assignments = get_host_assignments(parse_hosts(hosts_string(slots)), len(slots))
        rendezvous = RendezvousService(assignments, address)
        procs = [
            worker.process(
                ProcessId("worker", info.rank),
                slot,
                rank=info.rank,
                **gloo_rank_env(slot, info, address, rendezvous.port),
            )
            for slot, info in zip(slots, assignments, strict=True)
        ]
        return Plan(procs, services=rendezvous, ports=rendezvous_ports(address, rendezvous.port))

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if self.elastic:
            return None  # the elastic driver restarts or ends; it says so through backend_done
        return super().outcome(records, ended)


def mpirun_process(
    slots: list[Slot], worker: WorkerCommand, user_env: dict[str, str]
) -> ProcessSpec:
    """One ``mpirun`` that starts a rank in every slot. The ranks name themselves from
    their MPI rank and report their own pids and exits, so each still gets a row."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("--controller mpi needs mpirun (Debian: openmpi-bin)")
    argv = [mpirun]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(len(slots)), "-H", hosts_string(slots)]
    argv += ["--bind-to", "none", "--map-by", "slot"]
    # Shared-memory single copy (CMA) is refused inside many containers.
    argv += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    env = {
        **worker.env,
        Env.IDENTITY_FROM_MPI: "1",
        "HOROVOD_CONTROLLER": "mpi",
        "HOROVOD_CPU_OPERATIONS": "mpi",
    }
    # Locally mpirun's children inherit its environment; -x carries it to other hosts.
    inherited = {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"} & set(os.environ)
    for key in sorted({*env, *user_env, *inherited}):
        argv += ["-x", key]
    ranks = {ProcessId("worker", slot.index): slot for slot in slots}
    return ProcessSpec(ProcessId("mpirun", 0), argv + worker.argv, env, hosts=ranks)
