"""One JSON message per packet on a ``SOCK_SEQPACKET`` Unix socket, with descriptors
passed alongside (a network namespace, say)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from ..contract.private import MAX_SOCKET_PATH, runtime_dir

MAX_MESSAGE = 1 << 20
MAX_FDS = 4


def keeper_socket(directory: Path) -> Path:
    """Where the keeper of the pool in ``directory`` listens: ``keeper.sock`` there, or,
    where that path is too long for a Unix socket (a deep home), in this user's private
    runtime directory, named by a digest of ``directory``."""
    path = directory / "keeper.sock"
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    return runtime_dir() / f"pool-{digest}.sock"


def send(sock: socket.socket, body: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send ``body`` (and ``fds``) as one packet."""
    socket.send_fds(sock, [json.dumps(body).encode()], fds or [])


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors that came with it; ``(None, [])`` when the
    peer has closed. A message that is not a JSON object raises ``ValueError``."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    body = json.loads(data)
    if not isinstance(body, dict):
        for fd in fds:
            os.close(fd)
        raise ValueError("a pool message must be a JSON object")
    return body, fds


def peer_is_us(sock: socket.socket) -> bool:
    """Whether the process on the other end runs as this user (SO_PEERCRED)."""
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def connect(path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
