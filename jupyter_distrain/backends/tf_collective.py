"""``--backend tf``: TensorFlow's MultiWorkerMirroredStrategy (collective allreduce over gRPC)."""

from __future__ import annotations

from ..contract.launch import Network, Slot
from .base import Backend, Plan, WorkerCommand
from .tf_config import (
    assign_roles,
    cluster_of,
    cluster_ports,
    grpc_needs_isolation,
    tensorflow_available,
    tf_config_processes,
)


class TFCollectiveBackend(Backend):
    name = "tf"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return tensorflow_available("MultiWorkerMirroredStrategy")

    def needs_isolation(self, on_other_hosts: bool) -> str | None:
        return grpc_needs_isolation(on_other_hosts)

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        placed = assign_roles(slots, [("worker", self.spec.workers)])
        cluster = cluster_of(placed, network)
        return Plan(
            tf_config_processes(placed, cluster, worker),
            info={"cluster": cluster},
            ports=cluster_ports(cluster),
        )
