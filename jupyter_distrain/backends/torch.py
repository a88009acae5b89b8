"""``--backend torch``: PyTorch's ``torch.distributed`` (DistributedDataParallel, FSDP),
every process started with the environment ``torchrun`` gives its workers.

So a script that runs under ``torchrun`` runs unchanged, and
``torch.distributed.init_process_group()`` with no arguments finds its rendezvous:
``MASTER_ADDR`` is rank 0's address as the other ranks reach it (the slot's address:
loopback inside a local job's private namespace, the host's address on the hosts'
network for ssh and Ray; never a host name, which may resolve to loopback),
``MASTER_PORT`` a port reserved on rank 0's host for the TCPStore that rank 0 serves.
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` name each slot's interface (the
pre-flight's, or ``--network-interface``). As under torchrun, ``OMP_NUM_THREADS=1`` where a
host runs several ranks, unless ``--cpu`` or ``--env`` says otherwise (two ranks of two
threads each on two cores ran at 0.30x torchrun's steps/sec).

torch's TCPStore is unauthenticated and listens on every interface of rank 0's host;
a local job keeps it in its private network namespace, across hosts the cell's
warning names its port (``docs/security.md``). Failures are the SPMD rule: the first
rank to fail fails the job and the others, blocked in a collective or not, are
stopped.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..contract.launch import Network, Slot
from ..contract.process import Env, ProcessId
from ..frameworks import importable, installed_version
from .base import Backend, Plan, WorkerCommand

INSTALL_HINT = (
    "torch is not installed: pip install 'jupyter_distrain[torch]' "
    "(a CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)
STORE_PORT = "torch TCPStore (unauthenticated)"


def torchrun_env(slots: list[Slot], master: Slot, port: int, run_id: str) -> list[dict[str, str]]:
    """Each slot's variables, as ``torchrun`` sets them for its workers: one rank per
    slot in slot order, a "node" per distinct host in order of first appearance."""
    per_host = Counter(slot.host for slot in slots)
    nodes = list(dict.fromkeys(slot.host for slot in slots))
    common = {
        "MASTER_ADDR": master.address,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(slots)),
        "ROLE_WORLD_SIZE": str(len(slots)),
        "GROUP_WORLD_SIZE": str(len(nodes)),
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    return [
        {
            **common,
            "RANK": str(rank),
            "ROLE_RANK": str(rank),
            "LOCAL_RANK": str(slot.local_index),
            "LOCAL_WORLD_SIZE": str(per_host[slot.host]),
            "GROUP_RANK": str(nodes.index(slot.host)),
            "GLOO_SOCKET_IFNAME": slot.iface,
            "NCCL_SOCKET_IFNAME": slot.iface,
        }
        for rank, slot in enumerate(slots)
    ]


class TorchBackend(Backend):
    name = "torch"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return importable("torch", INSTALL_HINT)

    @classmethod
    def framework_version(cls) -> str | None:
        return installed_version("torch")

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        master = slots[0]
        (port,) = network.reserve_ports([master])
        run_id = Path(worker.env[Env.JOB_DIR]).name  # the job's id
        env = torchrun_env(slots, master, port, run_id)
        if self.spec.cpu is None and "OMP_NUM_THREADS" not in self.spec.env:
            for rank_env in env:  # as torchrun: one thread a rank where a host has several
                if rank_env["LOCAL_WORLD_SIZE"] != "1":
                    rank_env["OMP_NUM_THREADS"] = "1"
        processes = [
            worker.process(ProcessId("worker", slot.index), slot, rank=rank, **env[rank])
            for rank, slot in enumerate(slots)
        ]
        return Plan(
            processes,
            info={"master": f"{master.address}:{port}"},
            ports={STORE_PORT: [port]},
        )
