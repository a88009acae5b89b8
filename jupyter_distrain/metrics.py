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
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from .contract import WorkerChannels, identity_from

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.25  # the longest a record waits in a worker
HEARTBEAT_SECONDS = 1.0
BATCH_RECORDS = 512  # flush early past this many records


def signature(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, payload, hashlib.sha256).hexdigest().encode()


class Collector:
    """Receives signed batches on a PULL socket and appends them to ``metrics.jsonl``."""

    def __init__(
        self,
        secret: str,
        path: Path,
        on_record: Callable[[dict[str, Any]], None],
        host: str = "127.0.0.1",
    ):
        self.secret = secret.encode()
        self.path = path
        self.on_record = on_record
        self.accepted = 0  # batches
        self.records = 0
        self.rejected = 0
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
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
                else:
                    out.flush()
            self._receive_waiting(out)
            out.flush()

    def _receive_waiting(self, out: Any) -> None:
        """Store every message already queued on the socket."""
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._accept(frames, out)

    def _accept(self, frames: list[bytes], out: Any) -> None:
        if len(frames) != 2 or not hmac.compare_digest(
            signature(self.secret, frames[0]), frames[1]
        ):
            self.rejected += 1
            return
        payload = frames[0]
        if not payload.endswith(b"\n"):
            payload += b"\n"
        out.write(payload)
        self.accepted += 1
        lines = payload.rstrip(b"\n").split(b"\n")
        self.records += len(lines)
        # the live view wants the latest step; epoch summaries and heartbeats may follow it
        latest = None
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
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
        self._buffer: list[bytes] = []
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 2000)  # at exit, wait up to 2 s to deliver
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never drop: block instead
        self._sock.connect(address)
        self._last_sent = 0.0
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-reporter", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def report(self, record: dict[str, Any]) -> None:
        line = json.dumps({**self.identity, **record}, separators=(",", ":")).encode()
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
            self._sock.send_multipart([payload, signature(self.secret, payload)])
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
