"""TF_CONFIG for TensorFlow's own distributed runtimes (ps and tf backends)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence

from ..contract.launch import Network, ProcessSpec, Slot
from ..contract.process import ProcessId
from .base import WorkerCommand


def grpc_needs_isolation(on_other_hosts: bool) -> str | None:
    """:meth:`Backend.needs_isolation` of a job of TensorFlow's gRPC servers: they run any
    graph a caller sends (its ops read and write files), so one reached by other users
    of this machine runs their code as the job's owner. Other hosts the user asked for
    reach them anyway (the warning names their ports)."""
    if on_other_hosts:
        return None
    return (
        "TensorFlow's gRPC servers run any graph a caller sends them (reading and writing "
        "your files), so whoever reaches their ports runs code as you; run it where user "
        "namespaces are allowed, or with --backend horovod or torch"
    )


def tensorflow_available(what: str) -> tuple[bool, str]:
    if importlib.util.find_spec("tensorflow") is None:
        return False, "tensorflow is not installed"
    return True, f"tensorflow is installed ({what})"


def assign_roles(
    slots: Sequence[Slot], roles: Sequence[tuple[str, int]]
) -> list[tuple[ProcessId, Slot]]:
    """Give ``(role, count)`` groups consecutive slots, in order."""
    ids = [ProcessId(role, index) for role, count in roles for index in range(count)]
    return list(zip(ids, slots, strict=False))


def cluster_of(placed: Sequence[tuple[ProcessId, Slot]], network: Network) -> dict[str, list[str]]:
    """The TF cluster dict ``{"ps": ["host:port", ...], ...}``, with ports reserved."""
    ports = network.reserve_ports([slot for _, slot in placed])
    cluster: dict[str, list[str]] = {}
    for (pid, slot), port in zip(placed, ports, strict=True):
        cluster.setdefault(pid.role, []).append(f"{slot.address}:{port}")
    return cluster


def cluster_ports(cluster: dict[str, list[str]]) -> dict[str, list[int]]:
    """The ports of a TF cluster's servers (unauthenticated gRPC, every interface)."""
    ports = [int(a.rpartition(":")[2]) for addresses in cluster.values() for a in addresses]
    return {"TensorFlow gRPC (unauthenticated)": ports}


def tf_config_processes(
    placed: Sequence[tuple[ProcessId, Slot]],
    cluster: dict[str, list[str]],
    worker: WorkerCommand,
    **extra_env: str,
) -> list[ProcessSpec]:
    """One process per placed role, each with its own TF_CONFIG task."""
    return [
        worker.process(
            pid,
            slot,
            rank=pid.index,
            TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": pid.role, "index": pid.index}}
            ),
            **extra_env,
        )
        for pid, slot in placed
    ]
