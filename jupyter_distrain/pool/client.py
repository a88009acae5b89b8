"""What the notebook and the supervisor ask of pools.

- :func:`ensure`: at submit, the pool a job may take processes from (its keeper
  started if none runs); its socket path goes into the job's spec.
- :func:`announce`: in the supervisor, before its first claim: a job runs (while the
  returned connection is open), so the pool imports at idle priority meanwhile.
- :func:`claim`: in the supervisor, a pooled process for one of the job's processes,
  as a :class:`PooledProcess` handle; None (start it cold) when the pool has none
  ready or it does not match.
- :func:`want`: in the supervisor at the job's end, refill the pool for the next run.
- :func:`list_pools` / :func:`drain`: ``%distributed pool``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.private import check_private
from ..contract.store import jobs_root
from ..processes import private_bytes, rss, same_process
from ..timing import poll_until
from . import wire
from .kinds import pool_name, pool_prefix
from .stock import OFF_FILE

log = logging.getLogger(__name__)

CONNECT_SECONDS = 2.0
KEEPER_START_SECONDS = 5.0  # a keeper just started listens within this
CLAIM_SECONDS = 15.0  # the keeper waits up to 10 s for the pooled process itself
BYE_GRACE_SECONDS = 2.0  # a pooled process whose keeper is gone: its bye comes within this
EXIT_LOST = 255  # it ended with no keeper to report its code, and without a bye


def pools_dir(root: Path | None = None, create: bool = False) -> Path:
    """Where pools live: ``.pools`` in the jobs root, private like it."""
    path = (root or jobs_root(create=create)) / ".pools"
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def host_pools_dir(root: Path, create: bool = False) -> Path:
    """Where the pools of a host that runs jobs for another machine (an ssh host) live:
    beside the local ones, named by this host's name (hosts may share a home)."""
    digest = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:10]
    path = pools_dir(root, create) / f"host-{digest}"
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def ensure(
    kind: str, environ: dict[str, str], base: Path | None = None, detach: bool = False
) -> str | None:
    """The socket of the pool for ``kind``, this interpreter and the installed code (in
    ``base``, by default the local pools' directory), starting its keeper (detached,
    with ``environ``'s pool settings) if none runs; None when that pool was turned off
    (it could not serve jobs here). Pools of the same kind and interpreter that ran
    other code are drained. ``detach``: the keeper is not this process's child (call it
    before this process becomes a subreaper, or the keeper comes back to it), and is
    listening when this returns. Raises
    ``OSError`` when the pool cannot live here (an unsafe directory)."""
    name = pool_name(kind)
    base = base or pools_dir(create=True)
    directory = base / name
    directory.mkdir(mode=0o700, exist_ok=True)
    check_private(directory, "the pool directory")
    if (directory / OFF_FILE).exists():
        return None
    _drain_stale(base, pool_prefix(kind), name)
    path = wire.keeper_socket(directory)
    if _answers(path):
        return str(path)
    argv = [sys.executable, "-m", "jupyter_distrain.pool.keeper", str(directory), kind]
    if detach:
        middle = os.fork()  # its child is nobody's here: not swept with what we started
        if middle == 0:
            try:
                _start_keeper(argv, environ, directory)
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        # the caller claims at once: its first claim plans the next run's processes. A
        # killed keeper leaves its socket behind: listening, not existing, says it is up
        poll_until(lambda: _answers(path), KEEPER_START_SECONDS, 0.02)
    else:
        keeper = _start_keeper(argv, environ, directory)
        threading.Thread(target=keeper.wait, daemon=True).start()  # no zombie in the kernel
    return str(path)


def _answers(path: Path) -> bool:
    """Whether a keeper listens at ``path``."""
    try:
        wire.connect(str(path), CONNECT_SECONDS).close()
    except OSError:
        return False
    return True


def _start_keeper(argv: list[str], environ: dict[str, str], directory: Path) -> subprocess.Popen:
    with open(directory / "keeper.log", "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=directory,
            start_new_session=True,
        )


def _drain_stale(base: Path, prefix: str, current: str) -> None:
    """Drain the pools named ``prefix...`` but ``current``: their processes imported
    code that is no longer installed."""
    for stale in base.glob(prefix + "*/"):
        if stale.name != current and wire.keeper_socket(stale).exists():
            with contextlib.suppress(OSError, ValueError):
                _ask(str(wire.keeper_socket(stale)), {"op": "drain"})
                log.info("drained the stale pool %s", stale.name)


@dataclass
class Claimed:
    """A process the pool handed over: who it is, and the claim's connection, on which
    the keeper sends its exit code (the launcher's handle reads it:
    ``launchers/handles.PooledProcess``)."""

    pid: int
    create_time: float
    connection: socket.socket


def exit_code_sent(connection: socket.socket) -> int | None:
    """The exit code the keeper sent on a claim's ``connection`` (which has something to
    read); None: it closed without one (a lost keeper)."""
    try:
        body, _ = wire.receive(connection)
    except (OSError, ValueError):
        body = None
    return body["exit"] if body is not None and isinstance(body.get("exit"), int) else None


def claim(
    socket_path: str,
    request: dict[str, Any],
    output: int | None = None,
    handoff: int | None = None,
) -> Claimed | str:
    """Ask the pool for a process to run ``request`` (argv, env, cwd, log, cpus, job,
    run), handing over this process's network and user namespaces (and ``output``, a descriptor
    its output goes to instead of a ``log`` file; ``handoff``, the memory file its
    secret and pushed values are in: ``contract/handoff.py``); else why it starts cold."""
    try:
        connection = wire.connect(socket_path, CONNECT_SECONDS)
    except OSError as exc:
        log.info("no pool at %s: %s", socket_path, exc)
        return f"no pool answers: {exc}"
    netns = os.open("/proc/self/ns/net", os.O_RDONLY)
    userns = os.open("/proc/self/ns/user", os.O_RDONLY)
    try:
        connection.settimeout(CLAIM_SECONDS)
        fds = [netns, userns, *(fd for fd in (output, handoff) if fd is not None)]
        flags = {"output": output is not None, "handoff": handoff is not None}
        wire.send(connection, {"op": "claim", **request, **flags}, fds)
        answer, _ = wire.receive(connection)
        if answer is None or "pid" not in answer:
            why = str((answer or {}).get("empty", "no answer"))
            log.info("pool: %s", why)
            connection.close()
            return why
        connection.settimeout(None)
        return Claimed(int(answer["pid"]), float(answer["create_time"]), connection)
    except (OSError, ValueError) as exc:
        log.warning("pool claim failed: %s", exc)
        connection.close()
        return f"the claim failed: {exc}"
    finally:
        os.close(netns)
        os.close(userns)


def announce(socket_path: str, job: str) -> socket.socket | None:
    """Tell the pool a job runs until the returned connection is closed; None if the
    pool cannot be reached (the job then simply starts cold)."""
    try:
        connection = wire.connect(socket_path, CONNECT_SECONDS)
        wire.send(connection, {"op": "running", "job": job})
    except OSError as exc:
        log.info("no pool at %s: %s", socket_path, exc)
        return None
    return connection


def _ask(socket_path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    with wire.connect(socket_path, CONNECT_SECONDS) as connection:
        wire.send(connection, body)
        answer, _ = wire.receive(connection)
        return answer


def want(socket_path: str, count: int, env: dict[str, str]) -> None:
    """Ask the pool to keep ``count`` idle processes, imported with ``env`` (less what is
    set per job, given at claim time)."""
    body = {"op": "want", "count": count, "env": env}
    try:
        _ask(socket_path, body)
    except (OSError, ValueError) as exc:
        log.warning("cannot refill the pool at %s: %s", socket_path, exc)


@dataclass
class PoolInfo:
    """One pool, as ``%distributed pool`` lists it."""

    name: str
    kind: str
    python: str
    keeper: int
    idle: list[int] = field(default_factory=list)  # ready to take a job
    starting: list[int] = field(default_factory=list)  # still importing
    claimed: list[int] = field(default_factory=list)  # running a job
    zygote: int = 0  # the process the idle ones are forked from (0: none)
    zygote_ready: bool = False  # it has imported
    memory_bytes: int = 0  # the zygote's resident memory and what each idle one holds alone
    idle_seconds: float = 0.0
    error: str = ""


def list_pools(root: Path | None = None, base: Path | None = None) -> list[PoolInfo]:
    """The pools whose keeper is running (in ``base``, by default the local pools'
    directory), with their processes and memory."""
    import json

    found = []
    base = base or pools_dir(root)
    for state_file in sorted(base.glob("*/state.json")) if base.is_dir() else []:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if same_process(state.get("pid"), state.get("create_time")) is None:
            continue  # its keeper is gone
        info = PoolInfo(
            state_file.parent.name,
            state["kind"],
            state["python"],
            state["pid"],
            idle_seconds=state.get("idle_seconds", 0.0),
            error=state.get("error", ""),
        )
        for row in state.get("idle", []):
            (info.idle if row["ready"] else info.starting).append(row["pid"])
        info.claimed = [row["pid"] for row in state.get("claimed", [])]
        zygote = state.get("zygote") or {}
        info.zygote, info.zygote_ready = zygote.get("pid", 0), bool(zygote.get("ready"))
        # forked from the zygote, an idle process shares most of its pages with it
        info.memory_bytes = sum(private_bytes(pid) for pid in [*info.idle, *info.starting])
        if info.zygote:
            info.memory_bytes += rss(info.zygote)
        found.append(info)
    return found


def drain(root: Path | None = None, base: Path | None = None) -> int:
    """End every pool (in ``base``, by default the local pools' directory): its idle
    processes now, its keeper once no job holds one of its processes; returns how many
    pools were asked."""
    return len(drain_pools(base or pools_dir(root)))


def drain_pools(base: Path) -> list[PoolInfo]:
    """:func:`drain` the pools in ``base``; those whose keeper answered, as they were
    before (a drained keeper may end at once: listing after would miss it)."""
    asked = []
    for info in list_pools(base=base):
        path = wire.keeper_socket(base / info.name)
        with contextlib.suppress(OSError, ValueError):
            _ask(str(path), {"op": "drain"})
            asked.append(info)
    return asked
