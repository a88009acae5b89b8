"""A private network namespace for a local job: loopback only, so the servers its
processes start (TensorFlow's gRPC servers bind every interface, Horovod's rendezvous
too) cannot be reached from another host, whatever address they bind.

The supervisor calls :func:`private_network` first thing, single-threaded; every
process it starts then shares the namespace. As root it is ``unshare(CLONE_NEWNET)``;
otherwise an unprivileged user namespace (the same uid mapped to itself) carries it,
where the kernel allows those. The kernel and the job talk through Unix sockets in the
job directory, which no network namespace affects.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _map_self() -> None:
    """In a new user namespace, be the same uid and gid as outside."""
    uid, gid = os.getuid(), os.getgid()
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


def private_network() -> str | None:
    """Move this process into a new network namespace with only loopback up.
    Returns None when done, else why it could not be done."""
    try:
        if os.geteuid() == 0:
            _unshare(CLONE_NEWNET)
        else:
            _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            _map_self()
        _loopback_up()
    except OSError as exc:
        return f"no private network namespace ({exc.strerror or exc})"
    return None


def interfaces() -> list[str]:
    """The network interfaces this process sees (a check for tests and status)."""
    return sorted(name for _, name in socket.if_nameindex())
