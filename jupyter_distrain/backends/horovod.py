"""Horovod backend: ring allreduce over Gloo (default) or MPI (``--controller mpi``).

Gloo mode needs no horovodrun, no ssh and no MPI: the supervisor runs Horovod's
rendezvous server itself (:mod:`.horovod_rendezvous`) and gives every process the
variables horovodrun would have set; an elastic program runs under Horovod's own
driver (:mod:`.horovod_elastic`). MPI mode runs one ``mpirun`` that starts every rank.

Design decision
---------------

- **Horovod without horovodrun** (`backends/horovod.py`): the supervisor runs
  Horovod's `RendezvousServer` with the plan from `get_host_assignments` and
  gives each worker the `HOROVOD_*` variables listed in DESIGN.md. This saves
  horovodrun's own start-up (see the benchmark). `--controller mpi` runs one
  `mpirun` (with `--allow-run-as-root` as root, and
  `btl_vader_single_copy_mechanism none` because CMA is refused in containers);
  ranks report themselves by hello, so they still get rows, pids and logs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..contract.cellcheck import resizes_in_place, uses_horovod_elastic
from ..contract.launch import ELASTIC, Network, Slot
from ..contract.process import ProcessId
from ..contract.status import ProcessRecord
from ..frameworks import horovod_missing_reason
from .base import Backend, Outcome, Plan, WorkerCommand
from .horovod_elastic import ElasticRun
from .horovod_rendezvous import RendezvousService, gloo_rank_env, hosts_string, rendezvous_ports
from .mpirun import mpirun_process

HOROVOD_MPI_ENV = {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"}


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

    def needs(self) -> dict[str, str]:
        needed = super().needs()
        if uses_horovod_elastic(self.spec.code):  # under mpirun too: not only self.elastic
            needed[ELASTIC] = "Horovod elastic"
        return needed

    def needs_isolation(self, on_other_hosts: bool) -> str | None:
        if self.elastic and self.spec.controller != "mpi":
            return (
                "Horovod elastic's rendezvous server unpickles what any caller sends it, so "
                "whoever reaches its port runs code as you; run it where user namespaces "
                "are allowed, or without hvd.elastic (scaling then restarts from a checkpoint)"
            )
        return None

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        if self.spec.controller == "mpi":
            return Plan([mpirun_process(slots, worker, self.spec.env, HOROVOD_MPI_ENV)])
        address = network.driver_address()
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
