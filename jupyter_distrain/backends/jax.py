"""``--backend jax``: multi-process JAX (and Keras 3 on its JAX backend), every process
started with what ``jax.distributed.initialize()`` and ``keras.distribution.initialize()``
need, so both run with no arguments in the cell.

JAX reads only the coordinator's address from the environment; the process count and
id come from a "cluster environment" it detects. The worker bootstrap registers one
for this project (``worker/jax_hook.py``) that reads the variables set here. Keras 3
reads its own (``KERAS_DISTRIBUTION_*``) and passes them to JAX. The coordinator (a
gRPC service that rank 0 serves) is bound to rank 0's slot address, not JAX's default
of every interface: inside a local job's private namespace, the hosts' interface
across hosts. JAX's CPU collectives (Gloo) use each slot's interface. Keras 3 uses
JAX unless the job's ``--env KERAS_BACKEND`` says otherwise. Failures are the SPMD
rule: the first process to fail fails the job, and the others are stopped; JAX's
preemption service is off unless ``--env JAX_ENABLE_PREEMPTION_SERVICE=true`` (it
catches SIGTERM, so a stop would wait the whole grace for each process).
"""

from __future__ import annotations

from ..contract.launch import Network, Slot
from ..contract.process import JaxEnv, ProcessId
from ..frameworks import importable, installed_version
from .base import Backend, Plan, WorkerCommand

INSTALL_HINT = "jax is not installed: pip install 'jupyter_distrain[jax]' (CPU: pip install jax)"
COORDINATOR_PORT = "JAX coordinator (gRPC, unauthenticated)"
# what every process gets unless the job's --env says otherwise: Keras 3 on JAX, and no
# preemption service (it takes SIGTERM as a notice to reach a sync point, so a process
# would ignore the SIGTERM of a stop or of a failing job and live on until the SIGKILL)
UNLESS_TOLD = {"KERAS_BACKEND": "jax", "JAX_ENABLE_PREEMPTION_SERVICE": "false"}


def jax_env(slots: list[Slot], coordinator: str) -> list[dict[str, str]]:
    """Each slot's variables: one JAX process per slot, in slot order."""
    count = str(len(slots))
    return [
        {
            "JAX_COORDINATOR_ADDRESS": coordinator,
            "JAX_COORDINATOR_BIND_ADDRESS": coordinator,
            JaxEnv.PROCESS_COUNT: count,
            JaxEnv.PROCESS_ID: str(rank),
            JaxEnv.LOCAL_PROCESS_ID: str(slot.local_index),
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": count,
            "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
            "GLOO_SOCKET_IFNAME": slot.iface,
        }
        for rank, slot in enumerate(slots)
    ]


class JaxBackend(Backend):
    name = "jax"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return importable("jax", INSTALL_HINT)

    @classmethod
    def framework_version(cls) -> str | None:
        return installed_version("jax")

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        coordinator = slots[0]
        (port,) = network.reserve_ports([coordinator])
        address = f"{coordinator.address}:{port}"
        defaults = {k: v for k, v in UNLESS_TOLD.items() if k not in self.spec.env}
        processes = [
            worker.process(ProcessId("worker", slot.index), slot, rank=rank, **env, **defaults)
            for rank, (slot, env) in enumerate(zip(slots, jax_env(slots, address), strict=True))
        ]
        return Plan(processes, info={"coordinator": address}, ports={COORDINATOR_PORT: [port]})
