"""The supervisor's control channel: signed, fresh, never-replayed JSON requests over a
Unix socket in the job's private directory (or TCP, for workers on other hosts).

Each request is one line ``{"body": {...}, "nonce": hex, "time": t, "sig": hex}``;
``sig`` is the HMAC-SHA256 of the canonical JSON of the other three fields under
the job's secret (Jupyter signs its own messages the same way). The server
answers a request only when the signature is right, ``time`` is within
``FRESH_SECONDS`` of its clock and the nonce was not seen before; anything else
is refused with one short error and counted. Lines are bounded, reads time out
and the number of connections served at once is capped, so a local user without
the secret cannot hold the supervisor up. The reply is one JSON line.

Where the channel is, and its secret, are in the job directory's control file
(:class:`ControlInfo`); the requests themselves are built in :mod:`.process`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .private import write_atomic

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]

MAX_LINE_BYTES = 64 * 1024
READ_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 32
FRESH_SECONDS = 120.0
_SIG_RE = re.compile(r"[0-9a-f]{64}")
CONTROL_FILE = "control"  # the control file's name in a job directory


@dataclass
class ControlInfo:
    """The control file: how to reach the job's supervisor (0600: it holds the secret)."""

    address: str  # unix:/path or tcp:host:port
    metrics: str  # the ZeroMQ endpoint workers send metrics to
    secret: str
    pid: int  # the supervisor
    warden_pid: int | None = None  # its parent, which cleans up if the supervisor dies

    def write(self, path: Path) -> None:
        """Write the control file (atomically, 0600)."""
        write_atomic(path, json.dumps(dataclasses.asdict(self)))

    @classmethod
    def read(cls, path: Path) -> ControlInfo | None:
        """The control file at ``path``; None when there is none or it is unreadable."""
        try:
            data = json.loads(path.read_text())
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        except (FileNotFoundError, ValueError, TypeError, AttributeError):
            return None


def sign(secret: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret.encode(), canonical, hashlib.sha256).hexdigest()


def encode(secret: str, body: dict[str, Any]) -> bytes:
    """One signed request line, with a fresh nonce and the time."""
    payload = {"body": body, "nonce": secrets.token_hex(16), "time": time.time()}
    return json.dumps({**payload, "sig": sign(secret, payload)}).encode() + b"\n"


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError, TypeError):
        return None
    return message if isinstance(message, dict) else None


def verify(secret: str, line: bytes, now: float | None = None) -> dict[str, Any] | None:
    """The body of a correctly signed, fresh request, else None (no replay check)."""
    checked = _checked(secret, line, now)
    return checked[0] if checked else None


def _checked(
    secret: str, line: bytes, now: float | None = None
) -> tuple[dict[str, Any], str] | None:
    """(body, nonce) of a correctly signed, fresh request."""
    message = _parse(line)
    if message is None:
        return None
    body, nonce, sent, sig = (message.get(k) for k in ("body", "nonce", "time", "sig"))
    if not (isinstance(body, dict) and isinstance(nonce, str) and isinstance(sig, str)):
        return None
    if not isinstance(sent, int | float) or not _SIG_RE.fullmatch(sig) or len(nonce) > 64:
        return None
    now = time.time() if now is None else now
    if abs(now - sent) > FRESH_SECONDS:
        return None
    expected = sign(secret, {"body": body, "nonce": nonce, "time": sent})
    return (body, nonce) if hmac.compare_digest(expected, sig) else None


class ReplayGuard:
    """Remembers the nonces of recent requests: each is taken once. Older ones are
    refused by :func:`verify` as stale, so they need not be kept."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first_time(self, nonce: str) -> bool:
        now = time.time()
        with self._lock:
            if len(self._seen) > 1000:
                horizon = now - 2 * FRESH_SECONDS
                self._seen = {n: t for n, t in self._seen.items() if t > horizon}
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


def parse_address(address: str) -> tuple[int, Any]:
    """``unix:/path`` or ``tcp:host:port`` -> (socket family, socket address)."""
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    host, _, port = rest.rpartition(":")
    if kind == "tcp" and host and port.isdigit():
        return socket.AF_INET, (host, int(port))
    raise ValueError(f"not a control address: {address!r} (unix:/path or tcp:host:port)")


class ControlServer:
    """A small threaded server that hands verified requests to ``handler``."""

    def __init__(self, secret: str, handler: Handler, address: str):
        self.secret = secret
        self.rejected = 0  # bad signatures, stale or replayed requests, oversized lines
        self.refused = 0  # connections over MAX_CONNECTIONS
        self.replays = ReplayGuard()
        family, bind_to = parse_address(address)
        self._server = _make_server(self, family, bind_to, handler)
        if family == socket.AF_UNIX:
            os.chmod(bind_to, 0o600)
            self.address = f"unix:{bind_to}"
        else:
            host, port = self._server.server_address[:2]
            self.address = f"tcp:{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        family, path = parse_address(self.address)
        if family == socket.AF_UNIX:
            try:
                os.unlink(path)
            except OSError:
                pass

    def answer(self, line: bytes, handler: Handler) -> dict[str, Any]:
        """The reply to one request line."""
        checked = _checked(self.secret, line)
        if checked is None or not self.replays.first_time(checked[1]):
            self.rejected += 1
            return {"ok": False, "error": "bad signature"}
        body = checked[0]
        try:
            return {"ok": True, **handler(body)}
        except Exception as exc:  # report, keep serving
            log.warning("control request %s failed: %s", body.get("op"), exc)
            return {"ok": False, "error": str(exc)}


def _make_server(
    outer: ControlServer, family: int, address: Any, handler: Handler
) -> socketserver.BaseServer:
    class RequestHandler(socketserver.StreamRequestHandler):
        timeout = READ_TIMEOUT_SECONDS

        def handle(self) -> None:
            while True:
                try:
                    line = self.rfile.readline(MAX_LINE_BYTES + 1)
                except OSError:  # the read timed out or the peer went away
                    return
                if not line:
                    return
                if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
                    outer.rejected += 1
                    self.reply({"ok": False, "error": "request too long"})
                    return
                if not self.reply(outer.answer(line, handler)):
                    return

        def reply(self, body: dict[str, Any]) -> bool:
            try:
                self.wfile.write(json.dumps(body).encode() + b"\n")
            except OSError:  # the client went away without its answer
                return False
            return True

    base = socketserver.UnixStreamServer if family == socket.AF_UNIX else socketserver.TCPServer

    class Server(socketserver.ThreadingMixIn, base):  # type: ignore[valid-type,misc]
        daemon_threads = True
        allow_reuse_address = True
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

        def handle_error(self, request: Any, client_address: Any) -> None:
            log.debug("control connection failed", exc_info=True)  # no traceback per request

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                outer.refused += 1
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    return Server(address, RequestHandler)


def request(
    address: str, secret: str, body: dict[str, Any], timeout: float = 5.0
) -> dict[str, Any]:
    """Send one signed request and return the reply; raises OSError when unreachable."""
    family, target = parse_address(address)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(target)
        sock.sendall(encode(secret, body))
        data = b""
        while not data.endswith(b"\n") and len(data) <= MAX_LINE_BYTES * 16:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = _parse(data)
    return reply if reply is not None else {"ok": False, "error": "no reply"}
