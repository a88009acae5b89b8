"""One ``mpirun`` that starts every rank of a job: Horovod's MPI controller
(``--backend horovod --controller mpi``) and mpi4py programs (``--backend mpi``). Across
ssh hosts the ssh launcher starts it with its own agents (:mod:`..launchers.ssh.mpi`)."""

from __future__ import annotations

import os
import shutil

from ..contract.launch import ProcessSpec, Slot
from ..contract.process import Env, ProcessId
from .base import WorkerCommand
from .horovod_rendezvous import hosts_string


def mpirun_process(
    slots: list[Slot],
    worker: WorkerCommand,
    user_env: dict[str, str],
    backend_env: dict[str, str] | None = None,
) -> ProcessSpec:
    """One ``mpirun`` that starts a rank in every slot, each with ``backend_env`` too.
    The ranks name themselves from their MPI rank and report their own pids and exits,
    so each still gets a row."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun is not installed (Debian: openmpi-bin)")
    argv = [mpirun]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(len(slots)), "-H", hosts_string(slots)]
    argv += ["--bind-to", "none", "--map-by", "slot"]
    # Shared-memory single copy (CMA) is refused inside many containers.
    argv += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    env = {**worker.env, Env.IDENTITY_FROM_MPI: "1", **(backend_env or {})}
    # Locally mpirun's children inherit its environment; -x carries it to other hosts.
    inherited = {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"} & set(os.environ)
    # the ranks' keys, which the supervisor adds as it starts mpirun (contract/keys.py)
    for key in sorted({*env, *user_env, *inherited, Env.KEYS}):
        argv += ["-x", key]
    ranks = {ProcessId("worker", slot.index): slot for slot in slots}
    return ProcessSpec(ProcessId("mpirun", 0), argv + worker.argv, env, hosts=ranks)
