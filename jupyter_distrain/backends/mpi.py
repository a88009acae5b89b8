"""``--backend mpi``: the cell runs under ``mpirun``, one rank per slot, with
``mpi4py.MPI.COMM_WORLD`` ready (locally, and across ssh hosts over the ssh launcher's
MPI path). Each rank names itself from its MPI rank, so the widget shows ranks and
their output as for Horovod's MPI controller; the SPMD failure rule applies (the first
rank to fail fails the job, and mpirun takes the others down)."""

from __future__ import annotations

import importlib.util
import shutil

from ..contract.launch import Network, Slot
from .base import Backend, Plan, WorkerCommand
from .mpirun import mpirun_process


class MpiBackend(Backend):
    name = "mpi"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed: pip install mpi4py (it needs OpenMPI's mpicc)"
        if shutil.which("mpirun") is None:
            return False, "mpirun is not installed (Debian: openmpi-bin)"
        return True, "mpi4py and mpirun are installed"

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        return Plan([mpirun_process(slots, worker, self.spec.env)])
