"""The warm pools on a Ray cluster's nodes, for ``%distributed pool``.

Which clusters the notebook's jobs started a pool on is kept in ``ray-clusters.json``
in the local pools' directory (by the supervisor, at the first pooled start). Listing
or clearing runs ``python -m jupyter_distrain.launchers.ray.pools ADDRESS [--drain]``
per cluster, a Ray driver of its own (the kernel never becomes one): it asks every
alive node, with a zero-CPU task pinned there, for its pools (the host agent's
``pools``), and prints one JSON line ``{"nodes": {node address: [pool, ...] or why
not}}`` or ``{"error": ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ...pool import places
from ...pool.client import PoolInfo
from .probe import connect_driver, import_ray, run_driver

CLUSTERS_FILE = "ray-clusters.json"
ASK_SECONDS = 60.0  # a driver of its own, and a Ray worker started on each node


def remember(address: str) -> None:
    """Note that the cluster at ``address`` may have pools of ours on its nodes."""
    places.remember(CLUSTERS_FILE, address, {})


def cluster_pools(drain: bool = False, root: Path | None = None) -> dict[str, Any]:
    """Each node's pools, for every remembered cluster (after asking them to end their
    idle processes, with ``drain``): by "<node address> (Ray)", a list of
    :class:`PoolInfo` or why the node could not be asked; by "Ray at <address>", why
    the cluster could not be."""
    found: dict[str, Any] = {}
    for address in sorted(places.remembered(CLUSTERS_FILE, root)):
        args = [address, *(["--drain"] if drain else [])]
        try:
            answer = run_driver(__name__, args, sys.executable, ASK_SECONDS)
        except (TimeoutError, RuntimeError) as exc:
            answer = {"error": str(exc)}
        nodes = answer.get("nodes")
        if "error" in answer or not isinstance(nodes, dict):
            found[f"Ray at {address}"] = str(answer.get("error", f"it answered {answer!r}"))
            continue
        for node, rows in sorted(nodes.items()):
            try:
                found[f"{node} (Ray)"] = (
                    rows if isinstance(rows, str) else [PoolInfo(**r) for r in rows]
                )
            except TypeError:
                found[f"{node} (Ray)"] = f"the node answered {str(rows)[:200]!r}"
    return found


def _pools_here(drain: bool) -> list[dict[str, Any]]:
    """On a node: its pools, as the host agent's ``pools`` lists them."""
    from jupyter_distrain.launchers.agent.files import JOBS_ROOT
    from jupyter_distrain.launchers.agent.pooled import pools

    return pools(drain, Path.home() / JOBS_ROOT)


def node_pools(address: str, drain: bool) -> dict[str, Any]:
    """Ask every alive node of the cluster at ``address`` for its pools."""
    why = connect_driver(address)
    if why is not None:
        return {"error": why or f"no Ray cluster at {address}"}
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        ask = ray.remote(num_cpus=0)(_pools_here)
        asked = {
            node["NodeManagerAddress"]: ask.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(drain)
            for node in ray.nodes()
            if node.get("Alive")
        }
        nodes: dict[str, Any] = {}
        for node, ref in asked.items():
            try:
                nodes[node] = ray.get(ref, timeout=ASK_SECONDS)
            except Exception as exc:  # the node went, or its worker could not start
                nodes[node] = f"cannot ask the node: {type(exc).__name__}"
    finally:
        ray.shutdown()
    return {"nodes": nodes}


def main(argv: list[str]) -> int:
    print(json.dumps(node_pools(argv[0], "--drain" in argv[1:])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
