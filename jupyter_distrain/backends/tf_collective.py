"""``--backend tf``: TensorFlow's MultiWorkerMirroredStrategy (collective allreduce over gRPC)."""

from __future__ import annotations

import importlib.util

from ..launchers.base import Launcher, ProcessSpec, Slot
from .base import Backend
from .tf_config import assign_roles, cluster_of, tf_config_processes


class TFCollectiveBackend(Backend):
    name = "tf"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("tensorflow") is None:
            return False, "tensorflow is not installed"
        return True, "tensorflow is installed (MultiWorkerMirroredStrategy)"

    def start_services(self, slots: list[Slot], launcher: Launcher) -> None:
        self.placed = assign_roles(slots, [("worker", self.spec.workers)])
        self.cluster = cluster_of(self.placed, launcher)

    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        return tf_config_processes(self.placed, self.cluster, worker_argv, worker_env)

    def info(self) -> dict[str, object]:
        return {"cluster": self.cluster}
