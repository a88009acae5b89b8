"""A pooled process: ``python -m jupyter_distrain.pool.idle FD KIND``, started by a keeper.

It imports its kind's libraries, says it is ready on the socket ``FD`` (its half of a
pair whose other half the keeper holds) and waits. Closed: it exits. Claimed: it takes
the job's network namespace, environment, working directory, CPUs and log, answers,
and from then on is the job's worker, exactly as ``python -m jupyter_distrain.worker``
would be: it runs one job and exits. While idle it dies with its keeper.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import socket
import sys
from typing import Any

from ..processes import die_with_parent, outlive_parent
from . import wire
from .kinds import PREIMPORTS

CLONE_NEWNET = 0x40000000


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def preimport(kind: str) -> dict[str, str]:
    """Import what every job of ``kind`` imports, and the worker bootstrap itself;
    return what the imports set in the environment."""
    before = dict(os.environ)
    for name in PREIMPORTS[kind]:
        importlib.import_module(name)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].keras.layers  # noqa: B018  (tf.keras is imported lazily)
    importlib.import_module("jupyter_distrain.worker.__main__")
    # e.g. TensorFlow's TF2_BEHAVIOR=1: a cold worker has them once its program imports
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def enter_network(fd: int) -> None:
    """Join the job's network namespace (the supervisor's), unless already in it."""
    ours = os.stat("/proc/self/ns/net").st_ino
    if os.fstat(fd).st_ino != ours:
        _check(_libc().setns(fd, CLONE_NEWNET), "cannot join the job's network namespace")


def become(claim: dict[str, Any], fds: list[int], imported_env: dict[str, str]) -> None:
    """Take on the job's identity: log, network, environment (with what the imports
    set, ``imported_env``), directory, CPUs."""
    log = os.open(claim["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    for fd in fds:
        enter_network(fd)
        os.close(fd)
    env = {**claim["env"], **imported_env}
    for name in [k for k in os.environ if k not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    cwd = claim.get("cwd") or os.getcwd()
    os.chdir(cwd)
    sys.path[0] = cwd  # what ``python -m`` puts first
    if claim.get("cpus"):
        os.sched_setaffinity(0, claim["cpus"])
    argv = claim["argv"]
    worker_main = sys.modules["jupyter_distrain.worker.__main__"]
    sys.modules["__main__"] = worker_main  # as under ``python -m jupyter_distrain.worker``
    sys.argv = [worker_main.__file__ or "", *argv[3:]]


def main(argv: list[str]) -> int:
    fd, kind = int(argv[0]), argv[1]
    die_with_parent()
    sock = socket.socket(fileno=fd)
    imported_env = preimport(kind)
    wire.send(sock, {"ready": True})
    try:
        claim, fds = wire.receive(sock)
    except (OSError, ValueError):
        return 0
    if claim is None:
        return 0  # the keeper let us go
    try:
        become(claim, fds, imported_env)
    except (OSError, KeyError, TypeError) as exc:
        wire.send(sock, {"error": str(exc)})
        return 3
    outlive_parent()  # the job's now: it outlives the keeper
    wire.send(sock, {"ok": True})
    sock.close()
    return sys.modules["jupyter_distrain.worker.__main__"].main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
