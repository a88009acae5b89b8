"""``--backend ps``: TensorFlow parameter servers.

Two modes, chosen by the cell:

- ParameterServerStrategy (TF2): a ``chief`` runs the cell; ``worker`` and ``ps``
  processes only run a TensorFlow server. The chief's exit decides the job;
  a worker dying is TensorFlow's coordinator's business (it retries elsewhere),
  so the job goes on; a ps dying fails the job (TensorFlow alone would hang).
- Seed mode (TF1, Cloudera's ``run_cluster`` contract): when the cell defines
  ``run(cluster, server, task_index)``, every ps joins its server and every
  worker calls ``run``; worker 0 is the chief and its exit decides the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..contract.cellcheck import defines_tf1_run
from ..contract.launch import Network, Slot
from ..contract.process import Env, Mode, ProcessId
from ..contract.status import ProcessRecord
from .base import Backend, Outcome, Plan, WorkerCommand, failed_first
from .tf_config import (
    assign_roles,
    cluster_of,
    cluster_ports,
    grpc_needs_isolation,
    tensorflow_available,
    tf_config_processes,
)


class ParameterServerBackend(Backend):
    name = "ps"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tf1_run = defines_tf1_run(self.spec.code)  # Cloudera's run(cluster, server, ...)
        self.chief = ProcessId("worker", 0) if self.tf1_run else ProcessId("chief", 0)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return tensorflow_available("parameter servers")

    def needs_isolation(self, on_other_hosts: bool) -> str | None:
        return grpc_needs_isolation(on_other_hosts)

    def roles(self) -> list[tuple[str, int]]:
        chief = [] if self.tf1_run else [("chief", 1)]
        return [*chief, ("worker", self.spec.workers), ("ps", self.spec.ps)]

    def slots_needed(self) -> int:
        return sum(count for _, count in self.roles())

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        placed = assign_roles(slots, self.roles())
        cluster = cluster_of(placed, network)
        # ParameterServerStrategy: what TensorFlow's tutorial sets (RPCs fail fast, so its
        # coordinator retries elsewhere). Not for a TF1 run(): a TF1 session opened on the
        # chief must wait for servers still starting, not fail on the first refusal.
        fail_fast = {} if self.tf1_run else {"GRPC_FAIL_FAST": "use_caller"}
        procs = tf_config_processes(placed, cluster, worker, **fail_fast)
        for proc in procs:
            if self.tf1_run:
                proc.env[Env.MODE] = Mode.TF1_RUN
            elif proc.id.role in ("worker", "ps"):
                proc.env[Env.MODE] = Mode.SERVER
        info = {"cluster": cluster, "tf1_run": self.tf1_run}
        return Plan(procs, info=info, ports=cluster_ports(cluster))

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if ended.role == "ps":
            return Outcome("failed", f"ps {ended.index} died ({ended.ended_text()})", ended)
        if ended.id == self.chief:
            if ended.exit_code == 0:
                return Outcome("succeeded")
            what = "worker 0 (the chief)" if self.tf1_run else "the chief"
            return Outcome("failed", f"{what} failed ({ended.ended_text()})", ended)
        if self.tf1_run and ended.exit_code:
            outcome = failed_first(records, ended)
            culprit = outcome.culprit or ended
            outcome.error = f"worker {culprit.index} failed ({culprit.ended_text()})"
            return outcome
        return None  # a ParameterServerStrategy worker lost: TensorFlow retries elsewhere
