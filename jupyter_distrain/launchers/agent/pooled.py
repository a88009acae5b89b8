"""A warm process for the agent's ``run``, from this host's own pool.

The pool is the notebook machine's (``jupyter_distrain.pool``), kept per host in
``~/.jupyter_distrain/jobs/.pools/host-<digest of the host name>/``: its keeper is
started by the first job that runs here with the pool on, lives detached from the ssh
session, and ends like a local one (bounded, idle for ``JUPYTER_DISTRAIN_POOL_IDLE``
seconds, or drained by ``%distributed pool --clear`` through the ``pools`` command).
The claimed process writes to this agent's stdout (the connection back), runs in this
session's network namespace, and its exit code comes from the keeper; the agent holds
a ``running`` connection meanwhile, so the pool imports for the next run lowered.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ...contract.handoff import memory_file
from ...contract.process import Env
from ...contract.spec import JobSpec
from ...pool import client as pool_client
from ...pool import kinds as pool_kinds
from ..handles import PooledProcess

log = logging.getLogger(__name__)


POOL_SETTINGS = (Env.POOL_SIZE, Env.POOL_IDLE, Env.POOL_MEMORY)


def pool_request(
    spec: JobSpec, argv: list[str], env: dict[str, str], run: str
) -> dict[str, Any] | None:
    """In a launcher: what a host's agent needs to take this process (``argv``, with
    ``env``) from its warm pool for ``run`` (one generation of the job); None when it
    starts cold (the pool is off, or it is not a worker bootstrap)."""
    kind = pool_kinds.KIND_OF_BACKEND.get(spec.backend)
    if not spec.pool or kind is None or not pool_kinds.enabled(os.environ):
        return None
    if argv[1:3] != ["-m", pool_kinds.WORKER_MODULE]:
        return None
    return {
        "kind": kind,
        "run": run,
        "ahead": pool_kinds.plans_ahead(env),
        # the notebook's bounds for the host's pool, as for its own
        "settings": {k: os.environ[k] for k in POOL_SETTINGS if k in os.environ},
    }


def host_pools(root: Path, create: bool = False) -> Path:
    """This host's pools directory under the agent's jobs directory ``root`` (made if
    need be)."""
    if create:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return pool_client.host_pools_dir(root, create=create)


def pool_for(request: dict[str, Any], env: dict[str, str], root: Path) -> str | None:
    """The socket of this host's pool for ``request`` (its keeper started, detached, if
    none runs: call this before the agent becomes a subreaper); None when the process
    is to start cold (not a worker bootstrap the launcher asked to pool, no pool here).
    ``root``: the agent's jobs directory."""
    pool, argv = request.get("pool"), request["argv"]
    if not isinstance(pool, dict) or pool.get("kind") not in pool_kinds.PREIMPORTS:
        return None
    if argv[:1] != [sys.executable] or argv[1:3] != ["-m", pool_kinds.WORKER_MODULE]:
        return None
    settings = {str(k): str(v) for k, v in dict(pool.get("settings") or {}).items()}
    try:
        return pool_client.ensure(
            pool["kind"], {**env, **settings}, base=host_pools(root, create=True), detach=True
        )
    except OSError as exc:
        log.info("no warm pool on this host: %s", exc)
        return None


def from_pool(
    socket_path: str, request: dict[str, Any], env: dict[str, str], directory: Path
) -> tuple[PooledProcess, socket.socket | None] | None:
    """A pooled process running ``request`` from the pool at ``socket_path``, and the
    connection that tells the pool a job runs; None: start it cold."""
    pool = request["pool"]
    presence = pool_client.announce(socket_path, str(directory))
    claim = {
        "argv": request["argv"],
        "env": env,
        "cwd": str(directory),
        "log": "",
        "cpus": request.get("cpus"),
        "job": str(directory),
        "run": str(pool.get("run", "")),
        "ahead": bool(pool.get("ahead", True)),
    }
    handed = memory_file(request["handoff"]) if "handoff" in request else None
    try:
        handle = PooledProcess.of(
            pool_client.claim(socket_path, claim, sys.stdout.fileno(), handed)
        )
    finally:
        if handed is not None:
            os.close(handed)
    if handle is None:
        if presence is not None:
            presence.close()
        return None
    return handle, presence


def pools(drain: bool, root: Path) -> list[dict[str, Any]]:
    """This host's pools (``pools`` command) under the agent's jobs directory ``root``;
    with ``drain``, those asked to end (as they were when asked)."""
    import dataclasses

    base = host_pools(root)
    found = pool_client.drain_pools(base) if drain else pool_client.list_pools(base=base)
    return [dataclasses.asdict(info) for info in found]
