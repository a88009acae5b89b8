"""A private network namespace for a local job: loopback only, so the servers its
processes start (TensorFlow's gRPC servers bind every interface, Horovod's rendezvous
too) cannot be reached from another host or by another user of this machine, whatever
address they bind. Reverse name lookups there get "no such name" at once
(:mod:`.lookups`), as outside.

The supervisor calls :func:`private_network` first thing, before any process of the job
starts; every process it starts then shares the namespace. As root it is
``unshare(CLONE_NEWNET)``; otherwise an unprivileged user namespace (the same uid mapped
to itself) carries it, where the kernel allows those (a container's seccomp profile
often refuses them). The kernel and the job talk through Unix sockets in the job
directory, which no network namespace affects.

Whether the namespace can be made is decided before this process enters one: a forked
child makes it first and checks that loopback is up and reachable. Only then does this
process make it, so a refusal leaves the job in the host's network, said plainly, and a
namespace is never half made: once this process has left the host's network, any later
failure is :class:`IsolationFailed`, which fails the job (a namespace without loopback
made every local connection fail with "Network is unreachable").

Design decision
---------------

- **Built for ordinary accounts, tested as one** (2026-12-06). The people this is for
  are not root. `launchers/isolation.py` reads the uid and gid before
  `unshare(CLONE_NEWUSER)` (after it they read as the overflow id, `uid_map` is refused
  and loopback stays down), and decides isolation before any process of the job
  starts: a forked child makes the namespaces, brings loopback up and connects to it;
  only then does the supervisor make its own; a half-made namespace fails the job in
  one line. Where namespaces are refused the job runs with a warning naming every port
  of its plan and who reaches it (`LauncherKind.reachable_by`), unless a server of it runs
  what it is sent (`Backend.needs_isolation`: Horovod elastic's rendezvous, TensorFlow's
  gRPC servers), which is refused unless the user asked for other hosts
  (`LauncherKind.runs_on_other_hosts`: ssh, Slurm, a Ray cluster; Horovod elastic is
  refused there too). A pooled process joins the job's user namespace, then its network
  namespace, then drops the capabilities joining gave it (`pool/idle.enter_network`).
  The supervisor raises its open-files soft limit to the hard limit (its children
  inherit it): its TCP channels (Slurm, Ray) are open to unauthenticated connections
  until they sign, and at 1024 a flood killed it. `make test` runs the user battery as
  `distrain-alice` (`tests/users/as_user.sh`) and only the tests marked `root` as root;
  `tests/test_users.py` has her neighbour `distrain-bob` probe her running jobs, and
  a real JupyterHub (`tests/hubserver.py`: LocalProcessSpawner, the idle culler) spawns
  both, driven through its API and kernels (`tests/test_hub.py`) and in Chromium
  (`labextension/ui-tests/tests/hub.spec.ts`). The UI tests' own server runs as her too.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

from .lookups import answer_reverse_lookups

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
PROBE_SECONDS = 10.0


class IsolationFailed(RuntimeError):
    """This process left the host's network but its namespace could not be finished."""


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _map_ids(uid: int, gid: int) -> None:
    """In a new user namespace, be ``uid``/``gid``: the ids this process had outside,
    read before the ``unshare`` (inside, until mapped, they read as the overflow id)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _check_loopback() -> None:
    """Raise unless a TCP connection to 127.0.0.1 succeeds here."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=PROBE_SECONDS):
            pass


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _enter() -> None:
    """Leave the host's network for a new namespace with loopback up and checked. An
    ``OSError`` before the ``unshare`` leaves this process where it was."""
    if os.geteuid() == 0:
        _unshare(CLONE_NEWNET)
    else:
        uid, gid = os.getuid(), os.getgid()
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        _map_ids(uid, gid)
    _loopback_up()
    _check_loopback()


def _probe() -> str | None:
    """Make the namespace in a forked child: None when it worked there, else why not."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        code = 0
        try:
            _enter()
        except BaseException as exc:  # noqa: BLE001 - any failure is the answer
            os.write(write_end, _reason(exc).encode()[:1000])
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        reason = pipe.read().decode(errors="replace")
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return reason or f"the namespace check ended with status {status}"


def namespace_refused() -> str | None:
    """Why this machine refuses a job a private network namespace, or None when it
    gives one (checked in a forked child: this process stays where it is)."""
    return _probe()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc) or type(exc).__name__


def private_network() -> str | None:
    """Move this process into a new network namespace with only loopback up, checked.
    Returns None when done, else why this machine refuses one (the process is then still
    in the host's network, untouched). Raises :class:`IsolationFailed` if this process
    left the host's network and the namespace could not be finished."""
    if os.geteuid() != 0 and _threads() > 1:  # the kernel refuses CLONE_NEWUSER then
        return "no private network namespace (the supervisor already runs threads)"
    refused = _probe()
    if refused:
        return f"no private network namespace ({refused})"
    before = _network_namespace()
    try:
        _enter()
    except OSError as exc:
        if _network_namespace() == before:
            return f"no private network namespace ({_reason(exc)})"
        raise IsolationFailed(
            f"the job's private network namespace could not be finished ({_reason(exc)})"
        ) from exc
    answer_reverse_lookups()  # "no such name" at once, not "try again" (lookups.py)
    return None


def _network_namespace() -> int:
    return os.stat("/proc/self/ns/net").st_ino


def interfaces() -> list[str]:
    """The network interfaces this process sees (a check for tests and status)."""
    return sorted(name for _, name in socket.if_nameindex())
