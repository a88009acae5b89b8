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

import importlib.util
from collections.abc import Sequence

from ..cellcheck import defines_seed_run
from ..launchers.base import Launcher, ProcessSpec, Slot
from ..store import ProcessRecord
from .base import Backend, Outcome, first_failure
from .tf_config import assign_roles, cluster_of, tf_config_processes


class ParameterServerBackend(Backend):
    name = "ps"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seed_mode = defines_seed_run(self.spec.code)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("tensorflow") is None:
            return False, "tensorflow is not installed"
        return True, "tensorflow is installed (parameter servers)"

    def roles(self) -> list[tuple[str, int]]:
        chief = [] if self.seed_mode else [("chief", 1)]
        return [*chief, ("worker", self.spec.workers), ("ps", self.spec.ps)]

    def slots_needed(self) -> int:
        return sum(count for _, count in self.roles())

    def start_services(self, slots: list[Slot], launcher: Launcher) -> None:
        self.placed = assign_roles(slots, self.roles())
        self.cluster = cluster_of(self.placed, launcher)

    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        procs = tf_config_processes(
            self.placed,
            self.cluster,
            worker_argv,
            worker_env,
            # what TensorFlow's tutorial sets: RPCs fail fast, so the coordinator retries
            {"GRPC_FAIL_FAST": "use_caller"},
        )
        for proc in procs:
            if self.seed_mode:
                proc.env["JUPYTER_DISTRAIN_MODE"] = "seed"
            elif proc.role in ("worker", "ps"):
                proc.env["JUPYTER_DISTRAIN_MODE"] = "server"
        return procs

    def info(self) -> dict[str, object]:
        return {"cluster": self.cluster, "seed_mode": self.seed_mode}

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if ended.role == "ps":
            return Outcome("failed", f"ps {ended.index} died (exit code {ended.exit_code})", ended)
        chief = ("worker", 0) if self.seed_mode else ("chief", 0)
        if (ended.role, ended.index) == chief:
            if ended.exit_code == 0:
                return Outcome("succeeded")
            what = "worker 0 (the chief)" if self.seed_mode else "the chief"
            return Outcome("failed", f"{what} failed (exit code {ended.exit_code})", ended)
        if self.seed_mode and ended.exit_code:
            culprit = first_failure(records) or ended
            return Outcome(
                "failed", f"worker {culprit.index} failed (exit code {culprit.exit_code})", culprit
            )
        return None  # a ParameterServerStrategy worker lost: TensorFlow retries elsewhere
