"""TF_CONFIG for TensorFlow's own distributed runtimes (ps and tf backends)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..launchers.base import Launcher, ProcessSpec, Slot


def assign_roles(
    slots: Sequence[Slot], roles: Sequence[tuple[str, int]]
) -> list[tuple[str, int, Slot]]:
    """Give ``(role, count)`` groups consecutive slots, in order."""
    out, i = [], 0
    for role, count in roles:
        for index in range(count):
            out.append((role, index, slots[i]))
            i += 1
    return out


def cluster_of(placed: Sequence[tuple[str, int, Slot]], launcher: Launcher) -> dict[str, list[str]]:
    """The TF cluster dict ``{"ps": ["host:port", ...], ...}``, with ports reserved."""
    ports = launcher.reserve_ports([slot for _, _, slot in placed])
    cluster: dict[str, list[str]] = {}
    for (role, _, slot), port in zip(placed, ports, strict=True):
        cluster.setdefault(role, []).append(f"{slot.address}:{port}")
    return cluster


def tf_config_processes(
    placed: Sequence[tuple[str, int, Slot]],
    cluster: dict[str, list[str]],
    worker_argv: list[str],
    worker_env: dict[str, str],
    extra_env: dict[str, str] | None = None,
) -> list[ProcessSpec]:
    """One process per placed role, each with its own TF_CONFIG task."""
    procs = []
    for role, index, slot in placed:
        tf_config = {"cluster": cluster, "task": {"type": role, "index": index}}
        env = {**worker_env, **(extra_env or {}), "TF_CONFIG": json.dumps(tf_config)}
        procs.append(ProcessSpec(role, index, worker_argv, env, slot, [index]))
    return procs
