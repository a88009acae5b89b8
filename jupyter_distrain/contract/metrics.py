"""The metrics channel: per-step records from workers to the supervisor, over ZeroMQ.

A worker's :class:`Reporter` batches records and sends each batch as one
two-frame message ``[payload, signature]``: ``payload`` is the records as JSON
lines, ``signature`` the hex HMAC-SHA256 of the payload under the job's secret.
The supervisor's :class:`Collector` drops (and counts) anything unsigned or
forged, and appends the payload bytes of valid batches to ``metrics.jsonl``
as they are: no record is parsed on the hot path except the last one of each
batch, which updates the live view of that process.

A record names its process with ``role`` and ``index`` (see ``contract``):
``{"role", "index", "step", "time", "images", "images_per_sec", "loss",
"total_steps", ...extra scalars}``; a heartbeat is ``{"role", "index", "time",
"heartbeat": true}``.

Over TCP (ssh and Ray jobs, whose channels the cluster network reaches) the socket is
also a CURVE server whose key pair is derived from the job's secret
(:func:`server_keys`): a peer that does not hold the secret cannot complete ZeroMQ's
handshake, and a connection whose handshake is not done within
:data:`HANDSHAKE_SECONDS` is closed, so nobody outside the job can hold connections
open (the control channel has its own deadlines and per-peer limits).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.utils.z85

from .process import WorkerChannels, identity_from

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # the longest a record waits in a worker (a wake-up costs the GIL)
HEARTBEAT_SECONDS = 1.0
BATCH_RECORDS = 512  # flush early past this many records


MAX_MESSAGE_BYTES = 4 * 2**20  # a batch of BATCH_RECORDS records is ~100 KB
MAX_SENDERS = 10_000
HANDSHAKE_SECONDS = 5.0  # a TCP peer that has not authenticated by then is dropped


def server_keys(secret: str) -> tuple[bytes, bytes]:
    """The CURVE (public, secret) key pair of a job's metrics socket, in Z85, derived from
    the job's secret: every process holding the secret knows the server's public key."""
    seed = hashlib.sha256(b"jupyter_distrain metrics curve\0" + secret.encode()).digest()
    secret_key = zmq.utils.z85.encode(seed)
    return zmq.curve_public(secret_key), secret_key


def _curve(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def connect_client(sock: zmq.Socket, address: str, secret: str) -> None:
    """Connect ``sock`` to the collector at ``address`` as a client of the job holding
    ``secret`` (a CURVE client over TCP, with a key pair of its own)."""
    if _curve(address):
        sock.curve_serverkey = server_keys(secret)[0]
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(address)


def signature(secret: bytes, header: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, header + b"\n" + payload, hashlib.sha256).hexdigest().encode()


def seal(secret: bytes, sender: str, seq: int, payload: bytes) -> list[bytes]:
    """The frames of one batch: ``[header, payload, signature]``. The header names the
    sender and numbers its batches, so a batch sent again is refused."""
    header = json.dumps({"sender": sender, "seq": seq}, separators=(",", ":")).encode()
    return [header, payload, signature(secret, header, payload)]


class Collector:
    """Receives signed batches on a PULL socket and appends them to ``metrics.jsonl``."""

    def __init__(
        self,
        secret: str,
        path: Path,
        on_record: Callable[[dict[str, Any]], None],
        endpoint: str = "tcp://127.0.0.1",
        on_write_error: Callable[[OSError], None] = lambda exc: None,
    ):
        """``endpoint``: ``ipc:///path`` (a local job), or ``tcp://host`` to bind a
        random port on that interface."""
        self.secret = secret.encode()
        self.path = path
        self.on_record = on_record
        self.accepted = 0  # batches
        self.records = 0
        self.rejected = 0  # forged, unsigned, malformed or replayed batches
        self.lost = 0  # records received but not stored (the disk was full)
        self.on_write_error = on_write_error
        self._last_seq: dict[str, int] = {}
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if _curve(endpoint):
            self._sock.curve_server = True
            self._sock.curve_secretkey = server_keys(secret)[1]
            self._sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * 1000))
        if endpoint.startswith("tcp://") and endpoint.count(":") == 1:
            port = self._sock.bind_to_random_port(endpoint)
            self.address = f"{endpoint}:{port}"
        else:
            self._sock.bind(endpoint)
            self.address = endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        with open(self.path, "ab") as out:
            while not self._stop.is_set():
                if poller.poll(100):
                    self._receive_waiting(out)
            self._receive_waiting(out)
            with contextlib.suppress(OSError):  # what a full disk refused is counted lost
                out.flush()

    def _receive_waiting(self, out: Any) -> None:
        """Store every message already queued on the socket."""
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._accept(frames, out)

    def _fresh(self, frames: list[bytes]) -> bool:
        """A correctly signed batch its sender has not sent before."""
        if len(frames) != 3:
            return False
        header, payload, sig = frames
        if not hmac.compare_digest(signature(self.secret, header, payload), sig):
            return False
        try:
            sender, seq = json.loads(header)["sender"], json.loads(header)["seq"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return False
        if not isinstance(seq, int) or seq <= self._last_seq.get(sender, -1):
            return False
        if sender not in self._last_seq and len(self._last_seq) >= MAX_SENDERS:
            return False
        self._last_seq[sender] = seq
        return True

    def _accept(self, frames: list[bytes], out: Any) -> None:
        if not self._fresh(frames):
            self.rejected += 1
            return
        payload = frames[1]
        if not payload.endswith(b"\n"):
            payload += b"\n"
        lines = payload.rstrip(b"\n").split(b"\n")
        try:
            out.write(payload)
            out.flush()
        except OSError as exc:
            self.lost += len(lines)
            self.on_write_error(exc)
            return
        self.accepted += 1
        self.records += len(lines)
        # the live view wants the latest step; epoch summaries and heartbeats may follow it
        latest = None
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(record, dict):
                continue
            latest = latest or record
            if "step" in record:
                latest = record if latest is record else {**record, "time": latest.get("time")}
                break
        if latest is not None:
            self.on_record(latest)

    def stop(self) -> None:
        """Store what has arrived, then close."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


class Reporter:
    """A worker's sender: buffers records, flushes every FLUSH_SECONDS or BATCH_RECORDS,
    and sends a heartbeat when there is nothing else to say."""

    def __init__(self, address: str, secret: str, identity: dict[str, Any]):
        self.secret = secret.encode()
        self.identity = identity
        self.sender = secrets.token_hex(8)
        self.seq = 0
        self.dropped = 0  # records that could not be encoded
        self._buffer: list[bytes] = []
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 2000)  # at exit, wait up to 2 s to deliver
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never drop: block instead
        connect_client(self._sock, address, secret)
        self._last_sent = 0.0
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-reporter", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def report(self, record: dict[str, Any]) -> None:
        """Queue one record; the process's identity always wins over the record's own
        ``role``/``index``. Never raises: a record that cannot be encoded is counted."""
        try:
            line = json.dumps(
                {**record, **self.identity}, separators=(",", ":"), default=_plain
            ).encode()
        except (TypeError, ValueError, RecursionError):
            self.dropped += 1
            return
        with self._lock:
            self._buffer.append(line)
            full = len(self._buffer) >= BATCH_RECORDS
        if full:
            self._wake.set()

    def flush(self) -> None:
        with self._lock:
            lines, self._buffer = self._buffer, []
        if not lines:
            return
        payload = b"\n".join(lines) + b"\n"
        with self._lock:  # zmq sockets are not thread-safe
            self.seq += 1
            self._sock.send_multipart(seal(self.secret, self.sender, self.seq, payload))
        self._last_sent = time.monotonic()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_SECONDS)
            self._wake.clear()
            if time.monotonic() - self._last_sent >= HEARTBEAT_SECONDS and not self._buffer:
                self.report({"time": time.time(), "heartbeat": True})
            try:
                self.flush()
            except zmq.ZMQError:
                return

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=2)
        try:
            self.flush()
        finally:
            self._sock.close()
            self._ctx.term()


def _plain(value: Any) -> Any:
    """JSON for what ``json`` cannot encode: numpy scalars and 0-d arrays (``.item()``),
    else a float when the value is a number, else its text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


_reporter: Reporter | None = None


def reporter() -> Reporter | None:
    """This process's reporter, made on first use; None outside a job."""
    global _reporter
    if _reporter is None:
        channels = WorkerChannels.from_env()
        if channels is not None and channels.metrics:
            _reporter = Reporter(
                channels.metrics, channels.secret, identity_from(os.environ).fields()
            )
    return _reporter


def close_reporter() -> None:
    """Deliver what this process has buffered and close its reporter, if it made one."""
    global _reporter
    if _reporter is not None:
        _reporter.close()
        _reporter = None
