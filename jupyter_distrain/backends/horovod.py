"""Horovod backend: ring allreduce over Gloo (default) or MPI (``--controller mpi``).

Gloo mode needs no horovodrun, no ssh and no MPI: the supervisor runs Horovod's
rendezvous server itself (:mod:`.horovod_rendezvous`) and gives every process the
variables horovodrun would have set; an elastic program runs under Horovod's own
driver (:mod:`.horovod_elastic`). MPI mode runs one ``mpirun`` that starts every rank.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..contract.cellcheck import resizes_in_place
from ..contract.process import Env, ProcessId
from ..contract.status import ProcessRecord
from ..frameworks import horovod_missing_reason
from ..launchers.base import Launcher, ProcessSpec, Slot
from .base import Backend, Outcome, Plan, WorkerCommand
from .horovod_elastic import ElasticRun
from .horovod_rendezvous import RendezvousService, gloo_rank_env, hosts_string, rendezvous_ports


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
