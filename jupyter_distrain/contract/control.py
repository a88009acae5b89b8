"""The supervisor's control channel: signed, fresh, never-replayed JSON requests over a
Unix socket in the job's private directory (or TCP, for workers on other hosts).

Each request is one line ``{"body": {...}, "nonce": hex, "time": t, "sig": hex}``;
``sig`` is the HMAC-SHA256 of the canonical JSON of the other three fields under
the job's secret (Jupyter signs its own messages the same way). The server
answers a request only when the signature is right, ``time`` is within
``FRESH_SECONDS`` of its clock and the nonce was not seen before; anything else
is refused with one short error and counted. Lines are bounded, reads time out
and the number of connections served at once is capped; at the cap a new connection
takes the slot of the oldest one that has not yet sent a signed request (from its own
address if that one holds ``MAX_CONNECTIONS_PER_PEER``, else from the address holding
most; one that has sent nothing before one whose request waits to be read), so peers
without the secret, from however many addresses, cannot keep the job's own processes
out. The reply is one JSON line.

Where the channel is, and its secret, are in the job directory's control file
(:class:`ControlInfo`); the requests themselves are built in :mod:`.process`.

Design decision
---------------

- **The control channel** (`contract/control.py`) is newline-delimited JSON over a Unix
  socket in the job directory (the job runs in its own network namespace, and a
  path in a 0700 directory admits nobody else), each request signed with
  HMAC-SHA256 under a per-job secret kept in the 0600 `control` file (the way
  Jupyter signs its messages), with a nonce and a time against replay. Clients
  send `stop`/`scale`/`stop_processes`; workers send `hello` (role, index, pid,
  host) and `bye` (exit code), shaped by `contract.hello`/`contract.bye`. A
  process is `running` once its hello arrives; the job is `running` when every
  member's has. Workers read the secret from the control file, never from
  their environment.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import select
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
READ_TIMEOUT_SECONDS = 10.0  # for a whole request line, however slowly it comes
MAX_CONNECTIONS = 32
MAX_CONNECTIONS_PER_PEER = (
    8  # over TCP: past this, an address's new connection takes its own oldest's slot
)
LISTEN_BACKLOG = 128  # connections the kernel queues before the server accepts them
NO_REPLY = "no reply"  # what request() answers for a connection closed unanswered
STALE = "stale request"  # signed right, by a clock more than FRESH_SECONDS off the server's
_offsets: dict[str, float] = {}  # address -> its server's clock minus ours, once learnt
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


def encode(secret: str, body: dict[str, Any], now: float | None = None) -> bytes:
    """One signed request line, with a fresh nonce and the time (``now``, else ours)."""
    sent = time.time() if now is None else now
    payload = {"body": body, "nonce": secrets.token_hex(16), "time": sent}
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
    secret: str, line: bytes, now: float | None = None, any_time: bool = False
) -> tuple[dict[str, Any], str] | None:
    """(body, nonce) of a correctly signed, fresh request (``any_time``: fresh or not)."""
    message = _parse(line)
    if message is None:
        return None
    body, nonce, sent, sig = (message.get(k) for k in ("body", "nonce", "time", "sig"))
    if not (isinstance(body, dict) and isinstance(nonce, str) and isinstance(sig, str)):
        return None
    if not isinstance(sent, int | float) or not _SIG_RE.fullmatch(sig) or len(nonce) > 64:
        return None
    now = time.time() if now is None else now
    if abs(now - sent) > FRESH_SECONDS and not any_time:
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
        self.refused = 0  # connections over MAX_CONNECTIONS while every slot held a signed request
        self.dropped = 0  # connections without a signed request yet, dropped for a newer one
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

    def answer(
        self, line: bytes, handler: Handler, verified: Callable[[], None] = lambda: None
    ) -> dict[str, Any]:
        """The reply to one request line (``verified`` is called once its signature,
        time and nonce are found right)."""
        checked = _checked(self.secret, line)
        if checked is None and _checked(self.secret, line, any_time=True) is not None:
            # signed with the secret, but by a clock far from ours: say our time, so
            # the client can time its requests by it (nothing is taken from this one)
            self.rejected += 1
            return {"ok": False, "error": STALE, "now": time.time()}
        if checked is None or not self.replays.first_time(checked[1]):
            self.rejected += 1
            return {"ok": False, "error": "bad signature"}
        body = checked[0]
        verified()
        try:
            return {"ok": True, **handler(body)}
        except Exception as exc:  # report, keep serving
            log.warning("control request %s failed: %s", body.get("op"), exc)
            return {"ok": False, "error": str(exc)}


@dataclass
class _Held:
    """A connection the control server serves."""

    peer: str
    signed: bool = False


def _make_server(
    outer: ControlServer, family: int, address: Any, handler: Handler
) -> socketserver.BaseServer:
    class RequestHandler(socketserver.StreamRequestHandler):
        timeout = READ_TIMEOUT_SECONDS

        def handle(self) -> None:
            pending = b""
            while True:
                line, pending = _read_line(self.request, pending)
                if line is None:  # the peer went away, or took too long over its request
                    return
                if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
                    outer.rejected += 1
                    self.reply({"ok": False, "error": "request too long"})
                    return
                mark = functools.partial(self.server.verified, self.request)
                if not self.reply(outer.answer(line, handler, mark)):
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
        # socketserver's 5 made the kernel drop connections arriving in a burst (a
        # 128-rank job's hellos, or a flood), each one retried a second later
        request_queue_size = LISTEN_BACKLOG
        # every connection served, oldest first: its address ("" over a Unix socket), and
        # whether it has sent a signed request
        held: dict[Any, _Held] = {}
        held_lock = threading.Lock()

        def handle_error(self, request: Any, client_address: Any) -> None:
            log.debug("control connection failed", exc_info=True)  # no traceback per request

        def process_request(self, request: Any, client_address: Any) -> None:
            peer = client_address[0] if isinstance(client_address, tuple) else ""
            with self.held_lock:
                victim = self._victim(peer)
                if victim is None and len(self.held) >= MAX_CONNECTIONS:
                    outer.refused += 1
                    self.shutdown_request(request)
                    return
                if victim is not None:
                    del self.held[victim]  # its slot is the new connection's
                    outer.dropped += 1
                    with contextlib.suppress(OSError):
                        victim.shutdown(socket.SHUT_RDWR)  # its thread ends at its next read
                self.held[request] = _Held(peer)
            super().process_request(request, client_address)

        def _victim(self, peer: str) -> Any:
            """The connection whose slot a new one from ``peer`` takes: None while there
            is room (or nothing unsigned to drop)."""
            mine = [r for r, h in self.held.items() if h.peer == peer]
            if peer and len(mine) >= MAX_CONNECTIONS_PER_PEER:
                candidates = mine
            elif len(self.held) >= MAX_CONNECTIONS:
                counts = collections.Counter(h.peer for h in self.held.values() if not h.signed)
                crowded = max(counts, key=counts.__getitem__, default="")
                candidates = [r for r, h in self.held.items() if h.peer == crowded]
            else:
                return None
            unsigned = [r for r in candidates if not self.held[r].signed]
            # one whose request already waits to be read is about to be answered: drop
            # a silent one while there is any
            return next((r for r in unsigned if not _has_bytes_waiting(r)), None) or next(
                iter(unsigned), None
            )

        def verified(self, request: Any) -> None:
            with self.held_lock:
                if request in self.held:
                    self.held[request].signed = True

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                with self.held_lock:
                    self.held.pop(request, None)

    return Server(address, RequestHandler)


def _has_bytes_waiting(sock: socket.socket) -> bool:
    """Whether ``sock`` has received bytes not yet read (without reading or waiting:
    its own timeout would make a peek wait)."""
    poller = select.poll()  # not select(): the supervisor may hold fds past FD_SETSIZE
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # the peer went away
        return False


def _read_line(sock: socket.socket, pending: bytes) -> tuple[bytes | None, bytes]:
    """One request line from ``sock`` (after what was already read, ``pending``), and
    what came after it. The whole line must arrive within ``READ_TIMEOUT_SECONDS``:
    a client that sends a byte now and then cannot hold a connection slot for longer.
    A line over ``MAX_LINE_BYTES`` is returned as it is (the caller refuses it)."""
    deadline = time.monotonic() + READ_TIMEOUT_SECONDS
    data = pending
    while b"\n" not in data and len(data) <= MAX_LINE_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, b""
        try:
            sock.settimeout(left)
            chunk = sock.recv(65536)
        except OSError:  # timed out, or the peer went away
            return None, b""
        if not chunk:
            return (data or None), b""
        data += chunk
    line, newline, rest = data.partition(b"\n")
    return line + newline, rest


def request(
    address: str, secret: str, body: dict[str, Any], timeout: float = 5.0
) -> dict[str, Any]:
    """Send one signed request and return the reply; raises OSError when unreachable.

    Requests are timed by the server's clock: when the server refuses one as stale
    (this host's clock is off by more than ``FRESH_SECONDS``), the offset it tells is
    kept for that address, said once in a warning, and the request signed again."""
    reply = _exchange(
        address, encode(secret, body, time.time() + _offsets.get(address, 0.0)), timeout
    )
    now = reply.get("now")
    if reply.get("error") == STALE and isinstance(now, int | float) and math.isfinite(now):
        offset = now - time.time()
        _offsets[address] = offset
        log.warning(
            "jupyter_distrain: this host's clock is %.0f s %s the supervisor's (%s); "
            "requests are timed by the supervisor's clock (set the clock right: NTP)",
            abs(offset),
            "behind" if offset > 0 else "ahead of",
            address,
        )
        reply = _exchange(address, encode(secret, body, time.time() + offset), timeout)
    return reply


def _exchange(address: str, line: bytes, timeout: float) -> dict[str, Any]:
    """Send one request line and read the one-line reply."""
    family, target = parse_address(address)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(target)
        sock.sendall(line)
        data = b""
        while not data.endswith(b"\n") and len(data) <= MAX_LINE_BYTES * 16:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = _parse(data)
    return reply if reply is not None else {"ok": False, "error": NO_REPLY}
