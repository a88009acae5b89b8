"""Horovod backend: ring allreduce over Gloo (default) or MPI (``--controller mpi``).

Gloo mode needs no horovodrun, no ssh and no MPI: the supervisor runs Horovod's
rendezvous server itself and gives every process the variables horovodrun
would have set. MPI mode runs one ``mpirun`` that starts every rank.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cellcheck import uses_horovod_elastic
from ..launchers.base import Launcher, ProcessSpec, Slot
from ..store import ProcessRecord
from .base import Backend, Outcome
from .horovod_elastic import ElasticRun


def hosts_string(slots: list[Slot]) -> str:
    """Horovod's ``host:slots,...`` notation for the placed slots, in order."""
    counts = Counter(s.host for s in slots)
    return ",".join(f"{host}:{counts[host]}" for host in dict.fromkeys(s.host for s in slots))


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.elastic = self.spec.controller == "gloo" and uses_horovod_elastic(self.spec.code)
        self._rendezvous: Any = None
        self._elastic: ElasticRun | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        spec = importlib.util.find_spec("horovod")
        if spec is None or not spec.submodule_search_locations:
            return False, "horovod is not installed"
        # horovod.tensorflow imports only when its compiled library was built
        libs = Path(spec.submodule_search_locations[0], "tensorflow").glob("mpi_lib*.so")
        if not any(libs):
            return False, "horovod was built without TensorFlow support"
        return True, "horovod is installed with TensorFlow support"

    # --- Gloo ------------------------------------------------------------
    def start_services(self, slots: list[Slot], launcher: Launcher) -> None:
        if self.spec.controller != "gloo":
            return
        if self.elastic:
            self._elastic = ElasticRun(self, slots, launcher.driver_address())
            return
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        self._plan = get_host_assignments(parse_hosts(hosts_string(slots)), len(slots))
        self._rendezvous = RendezvousServer(verbose=0)
        self._port = self._rendezvous.start()
        self._rendezvous.init(self._plan)
        self._address = launcher.driver_address()

    def stop_services(self) -> None:
        if self._elastic is not None:
            self._elastic.stop()
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None

    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        if self.spec.controller == "mpi":
            return [self._mpirun(slots, worker_argv, worker_env)]
        if self.elastic:
            return []  # the elastic driver starts them: see start()
        return [
            ProcessSpec(
                "worker",
                info.rank,
                worker_argv,
                {**worker_env, **self.rank_env(slot, info, self._address, self._port)},
                slot,
                [info.rank],
            )
            for slot, info in zip(slots, self._plan, strict=True)
        ]

    def rank_env(self, slot: Slot, info: Any, address: str, port: int) -> dict[str, str]:
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

    # --- elastic -----------------------------------------------------------
    def start(self, worker_argv: list[str], worker_env: dict[str, str]) -> None:
        if self._elastic is not None:
            self._elastic.start(worker_argv, worker_env)

    def scale_in_place(self, workers: int) -> bool:
        if self._elastic is None:
            return False
        self._elastic.scale(workers)
        return True

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if self.elastic:
            return None  # the elastic driver restarts or ends; it says so with backend_done
        return super().outcome(records, ended)

    # --- MPI -------------------------------------------------------------
    def _mpirun(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> ProcessSpec:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise RuntimeError("--controller mpi needs mpirun (Debian: openmpi-bin)")
        argv = [mpirun]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        argv += [
            "-np",
            str(len(slots)),
            "-H",
            hosts_string(slots),
            "--bind-to",
            "none",
            "--map-by",
            "slot",
            # Shared-memory single copy (CMA) is refused inside many containers.
            "--mca",
            "btl_vader_single_copy_mechanism",
            "none",
        ]
        env = {
            **worker_env,
            "JUPYTER_DISTRAIN_LOG_PER_RANK": "1",
            "HOROVOD_CONTROLLER": "mpi",
            "HOROVOD_CPU_OPERATIONS": "mpi",
        }
        # Locally mpirun's children inherit its environment; -x carries it to other hosts.
        inherited = {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"} & set(os.environ)
        for key in sorted({*env, *self.spec.env, *inherited}):
            argv += ["-x", key]
        ranks = list(range(len(slots)))
        return ProcessSpec("mpirun", 0, argv + worker_argv, env, None, ranks, hosts_ranks=True)
