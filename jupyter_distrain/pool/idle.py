"""A pooled process: ``python -m jupyter_distrain.pool.idle FD KIND [--zygote]``.

The keeper starts one *zygote* per environment: it imports its kind's libraries once,
then forks each idle process on request (``fork``, twice, so that the keeper is the
new process's parent): a refill costs a fork (~50 ms), not an import (~4 s of CPU),
so the pool can refill for the next run while a job runs, or straight after it. A
forked process takes a session of its own and new random seeds (numpy's and torch's
global generators were seeded at import), then is an idle process as below.

An idle process has its kind's libraries imported, says it is ready on the socket
``FD`` (its half of a pair whose other half the keeper holds) and waits (the zygote
hands a forked one its channel with the request). Closed: it exits. Claimed: it takes
the job's network namespace, environment, working directory, CPUs and log, answers,
and from then on is the job's worker, exactly as ``python -m jupyter_distrain.worker``
would be: it runs one job and exits. While idle it dies with its keeper.

It waits with one thread only: ``setns`` and ``sched_setaffinity`` move the calling
thread, so a thread started while importing would stay in the keeper's network
namespace, on every CPU. OpenBLAS (numpy's and scipy's) starts its thread pool when
loaded: it is stopped after the imports and starts again at the job's first BLAS call,
from the job's thread, in the job's namespace and CPUs. A kind whose imports leave any
other thread running is not pooled (its processes say so and the pool turns off).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import socket
import sys
import threading
from typing import Any

from ..contract.process import Env
from ..processes import die_with_parent, outlive_parent
from ..timing import poll_until
from . import wire
from .kinds import PREIMPORTS

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_CAPABILITY_VERSION_3 = 0x20080522
THREADS_END_SECONDS = 2.0  # how long stopped threads may take to be gone
SETTLE_SECONDS = 5.0  # how long a forked process may wait for the keeper to adopt it


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


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


def freeze_imported_objects() -> None:
    """Collect the imports' garbage, then move every object left to the collector's
    permanent generation. TensorFlow and Horovod leave ~280k objects that live as long as
    the process: a cold worker's full collections scan them all (0.13 s each, two before
    its first step here); a pooled one's scan only what its job made. Frozen objects are
    also never written by the collector, so forked processes share their pages."""
    gc.collect()
    gc.freeze()


def stop_blas_threads() -> None:
    """Stop the thread pools of the OpenBLAS libraries loaded (each starts its pool again
    at its next threaded call, from the calling thread)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            shutdown = library.blas_thread_shutdown_
        except (OSError, AttributeError):
            continue
        shutdown()


def other_threads() -> list[int]:
    """The ids of this process's threads but the calling one."""
    me = threading.get_native_id()
    return sorted(int(tid) for tid in os.listdir("/proc/self/task") if int(tid) != me)


class CannotEnter(OSError):
    """The job's namespace cannot be entered: as it would be at every claim."""


def _setns(fd: int, kind: int, what: str) -> None:
    if _libc().setns(fd, kind) != 0:
        errno = ctypes.get_errno()
        raise CannotEnter(errno, f"cannot join the job's {what} namespace: {os.strerror(errno)}")


def drop_capabilities() -> None:
    """Give up every capability: entering a user namespace grants them all in it, and a
    pooled process runs the job's code without the ``exec`` that clears them for a
    cold worker."""
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: two words each
    if _libc().capset(header, data) != 0:
        errno = ctypes.get_errno()
        raise CannotEnter(errno, f"cannot drop capabilities: {os.strerror(errno)}")


def enter_network(netns: int, userns: int) -> None:
    """Join the job's network namespace (the supervisor's), unless already in it, and
    first the user namespace that owns it (``userns``: an ordinary account's job makes
    one; joining its network namespace needs rights in it); every thread must end up
    in the network namespace, with no capability."""
    job = os.fstat(netns).st_ino
    if os.fstat(userns).st_ino != os.stat("/proc/self/ns/user").st_ino:
        _setns(userns, CLONE_NEWUSER, "user")  # the kernel wants one thread here
        entered_user = True
    else:
        entered_user = False
    if job != os.stat("/proc/self/ns/net").st_ino:
        _setns(netns, CLONE_NEWNET, "network")
    if entered_user:
        drop_capabilities()
    outside = [t for t in other_threads() if os.stat(f"/proc/self/task/{t}/ns/net").st_ino != job]
    if outside:
        raise CannotEnter(f"threads {outside} are outside the job's network namespace")


def become(claim: dict[str, Any], fds: list[int], imported_env: dict[str, str]) -> None:
    """Take on the job's identity: output (the next descriptor if the claim sends one,
    else its ``log`` file), network (``fds[0]``, in the user namespace ``fds[1]``), what
    it is handed in memory (the last descriptor, if the claim sends one), environment
    (with what the imports set, ``imported_env``), directory, CPUs."""
    netns, userns, *rest = fds
    handed = {}
    if claim.get("handoff") and rest:
        handed = {Env.HANDOFF_FD: str(rest.pop())}  # read and closed by the worker
    if claim.get("output") and rest:
        output = rest[0]
    else:
        output = os.open(claim["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(output, 1)
    os.dup2(output, 2)
    try:
        enter_network(netns, userns)
    finally:
        for fd in {output, *fds} - {int(v) for v in handed.values()}:
            os.close(fd)
    env = {**claim["env"], **imported_env, **handed}
    for name in [k for k in os.environ if k not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    cwd = claim.get("cwd") or os.getcwd()
    os.chdir(cwd)
    sys.path[0] = cwd  # what ``python -m`` puts first
    if claim.get("cpus"):
        for tid in [0, *other_threads()]:
            os.sched_setaffinity(tid, claim["cpus"])
    argv = claim["argv"]
    worker_main = sys.modules["jupyter_distrain.worker.__main__"]
    sys.modules["__main__"] = worker_main  # as under ``python -m jupyter_distrain.worker``
    sys.argv = [worker_main.__file__ or "", *argv[3:]]


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return str(tid)


def serve_forks(sock: socket.socket) -> socket.socket | None:
    """The zygote's loop: for each ``fork`` request (with the new process's channel as
    its descriptor), fork an idle process and answer its pid. Returns in that process,
    with its channel; None in the zygote once the keeper lets it go."""
    wire.send(sock, {"ready": True})
    while True:
        try:
            body, fds = wire.receive(sock)
        except (OSError, ValueError):
            return None
        if body is None:
            return None
        if not body.get("fork") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        pid = _fork_detached()
        if pid == 0:  # the new idle process
            sock.close()
            _settle(int(body.get("keeper", 0)))
            return socket.socket(fileno=fds[0])
        os.close(fds[0])
        wire.send(sock, {"pid": pid})


def _fork_detached() -> int:
    """Fork twice, the middle process exiting at once: the new process is then the
    keeper's child (a subreaper), as a started one is. Its pid here; 0 in it."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        child = os.fork()
        if child == 0:
            os.close(write)
            return 0
        os.write(write, str(child).encode())
        os._exit(0)  # nothing of the zygote's to clean up: it goes on
    os.close(write)
    os.waitpid(middle, 0)
    with os.fdopen(read, "rb") as answer:
        return int(answer.read() or 0)


def _settle(keeper: int) -> None:
    """A forked idle process: a session (and scheduling group) of its own, dying with
    the keeper, and random state of its own."""
    os.setsid()
    # the keeper is our parent once the middle process has exited (a moment from now)
    poll_until(lambda: os.getppid() == keeper, SETTLE_SECONDS, 0.001)
    die_with_parent()
    if os.getppid() != keeper:  # the keeper is gone already
        os._exit(0)
    reseed()


def reseed() -> None:
    """Draw new seeds for the generators that seeded themselves at import, as a process
    started afresh would (Python's ``random`` does so itself after a fork): without
    this, every process forked from one zygote would draw the same numbers."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def main(argv: list[str]) -> int:
    """``FD KIND [--zygote]``: import, then wait for a claim; a zygote waits for fork
    requests instead, and each process it forks then waits for a claim."""
    fd, kind = int(argv[0]), argv[1]
    die_with_parent()
    sock = socket.socket(fileno=fd)
    imported_env = preimport(kind)
    freeze_imported_objects()
    stop_blas_threads()
    # a stopped thread leaves /proc/self/task a moment after its shutdown returns
    if poll_until(lambda: not other_threads(), THREADS_END_SECONDS, 0.02) is False:
        names = sorted({_thread_name(t) for t in other_threads()})
        wire.send(sock, {"off": f"importing {kind} leaves threads running ({', '.join(names)})"})
        return 0
    if "--zygote" in argv[2:]:
        forked = serve_forks(sock)
        if forked is None:
            return 0
        sock = forked
    wire.send(sock, {"ready": True})
    try:
        claim, fds = wire.receive(sock)
    except (OSError, ValueError):
        return 0
    if claim is None:
        return 0  # the keeper let us go
    try:
        become(claim, fds, imported_env)
    except CannotEnter as exc:
        wire.send(sock, {"error": str(exc), "off": True})
        return 3
    except (OSError, KeyError, TypeError, ValueError) as exc:
        wire.send(sock, {"error": str(exc)})
        return 3
    outlive_parent()  # the job's now: it outlives the keeper
    wire.send(sock, {"ok": True})
    sock.close()
    return sys.modules["jupyter_distrain.worker.__main__"].main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
