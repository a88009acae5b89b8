"""The supervisor's control channel: signed JSON requests over TCP.

Each request is one line ``{"body": {...}, "sig": hex}`` where ``sig`` is the
HMAC-SHA256 of the canonical JSON body under the job's secret (Jupyter signs its
own messages the same way). A request with a bad signature is answered with an
error and otherwise ignored. The reply is one JSON line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def sign(secret: str, body: dict[str, Any]) -> str:
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def encode(secret: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"body": body, "sig": sign(secret, body)}).encode() + b"\n"


def verify(secret: str, line: bytes) -> dict[str, Any] | None:
    """Return the body of a correctly signed request, else None."""
    try:
        message = json.loads(line)
        body, sig = message["body"], message["sig"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(body, dict) or not isinstance(sig, str):
        return None
    return body if hmac.compare_digest(sign(secret, body), sig) else None


class ControlServer:
    """A small threaded TCP server that hands verified requests to ``handler``."""

    def __init__(self, secret: str, handler: Handler, host: str = "127.0.0.1"):
        self.secret = secret
        self.rejected = 0
        outer = self

        class _RequestHandler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    body = verify(outer.secret, line)
                    if body is None:
                        outer.rejected += 1
                        reply: dict[str, Any] = {"ok": False, "error": "bad signature"}
                    else:
                        try:
                            reply = {"ok": True, **handler(body)}
                        except Exception as exc:  # report, keep serving
                            log.exception("control request %r failed", body)
                            reply = {"ok": False, "error": str(exc)}
                    self.wfile.write(json.dumps(reply).encode() + b"\n")

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((host, 0), _RequestHandler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def request(
    host: str, port: int, secret: str, body: dict[str, Any], timeout: float = 5.0
) -> dict[str, Any]:
    """Send one signed request and return the reply; raises OSError when unreachable."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(encode(secret, body))
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data) if data else {"ok": False, "error": "no reply"}
