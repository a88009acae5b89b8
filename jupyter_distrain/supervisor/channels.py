"""The supervisor's two channels and the worker environment that names them: control
(signed JSON requests over TCP) and metrics (signed ZeroMQ batches)."""

from __future__ import annotations

import os
import secrets
from concurrent.futures import Future
from typing import Any

from ..contract import control, metrics
from ..contract.control import ControlInfo
from ..contract.process import Env, Op, ProcessId, WorkerChannels
from ..contract.spec import JobSpec
from ..contract.stacks import ANSWER_SECONDS as STACKS_ANSWER_SECONDS
from ..contract.stacks import NATIVE_SECONDS
from ..contract.store import JobDir
from .events import (
    Bye,
    Hello,
    Inbox,
    Metric,
    ScaleRequested,
    StacksRequested,
    StacksTaken,
    StopProcesses,
    StopRequested,
)
from .session import CellDone, CellPosted, CellResultAsked, CellStatusAsked, InterruptRequested

ANSWER_SECONDS = 30.0  # how long a client's request waits for the loop
STACKS_SECONDS = STACKS_ANSWER_SECONDS + NATIVE_SECONDS  # the longest a collection takes


def _cell_index(body: dict[str, Any]) -> int:
    index = body.get("cell")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"not a cell index: {index!r}")
    return index


class Channels:
    """Serves the job's control requests and collects its metrics, posting both to the
    loop's inbox; requests that need an answer wait for the loop's."""

    def __init__(self, job: JobDir, inbox: Inbox, host: str | None = None):
        """``host``: listen on TCP on that address only (the launcher's
        ``channel_host``, for processes on other machines); None: Unix sockets."""
        self.job = job
        self.inbox = inbox
        self.secret = secrets.token_hex(32)
        self.published: dict[str, Any] = {}  # the last state the loop saved
        # Unix sockets in the job's private directory: no other user can even connect
        control_path, metrics_path = job.socket_path("control"), job.socket_path("metrics")
        for path in (control_path, metrics_path):
            path.unlink(missing_ok=True)
        self.server = control.ControlServer(
            self.secret, self.handle, f"tcp:{host}:0" if host else f"unix:{control_path}"
        ).start()
        self.collector = metrics.Collector(
            self.secret,
            job.metrics_file,
            lambda record: inbox.post(Metric(record)),
            endpoint=f"tcp://{host}" if host else f"ipc://{metrics_path}",
            on_write_error=self._write_failed,
        ).start()
        if not host:
            metrics_path.chmod(0o600)
        job.write_control(
            ControlInfo(
                self.server.address, self.collector.address, self.secret, os.getpid(), os.getppid()
            )
        )

    def worker_env(self, spec: JobSpec) -> dict[str, str]:
        """What every process of the job is given, besides its own identity."""
        channels = WorkerChannels(str(self.job.path), self.server.address, self.collector.address)
        env = {**channels.env(), Env.BACKEND: spec.backend, Env.OUT: spec.out or ""}
        if spec.batch_size:
            env[Env.BATCH_SIZE] = str(spec.batch_size)
        if spec.checkpoint_every:
            env[Env.CHECKPOINT_EVERY] = str(spec.checkpoint_every)
        if spec.keras == "legacy":  # tf.keras is tf-keras (Keras 2), not Keras 3
            env["TF_USE_LEGACY_KERAS"] = "1"
        return {**env, "PYTHONUNBUFFERED": "1"}

    def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        """One verified control request (server threads)."""
        op = body.get("op")
        if op == Op.STATUS:
            return self.published
        if op == Op.SCALE:
            workers = body.get("workers")
            if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
                raise ValueError(f"scale needs a number of workers >= 1, got {workers!r}")
            return self.inbox.ask(ScaleRequested(workers), ANSWER_SECONDS) or {}
        if op == Op.STACKS:
            future: Future[dict[str, Any]] = Future()
            self.inbox.post(StacksRequested(future, native=body.get("native") is True))
            return future.result(timeout=ANSWER_SECONDS + STACKS_SECONDS)
        if op == Op.CELL_STATUS:
            return self.inbox.ask(CellStatusAsked(_cell_index(body)), ANSWER_SECONDS)
        if op == Op.CELL_RESULT:
            process = str(ProcessId.parse(str(body.get("process"))))
            return self.inbox.ask(CellResultAsked(_cell_index(body), process), ANSWER_SECONDS)
        if op == Op.CELL:
            return self.inbox.ask(CellPosted(_cell_index(body)), ANSWER_SECONDS) or {}
        if op == Op.CELL_DONE:
            self.inbox.post(CellDone(body))
        elif op == Op.INTERRUPT:
            self.inbox.post(InterruptRequested())
        elif op == Op.STOP:
            self.inbox.post(StopRequested(str(body.get("reason", "requested"))))
        elif op == Op.STOP_PROCESSES:
            self.inbox.post(StopProcesses([ProcessId.parse(p) for p in body.get("processes", [])]))
        elif op == Op.HELLO:
            self.inbox.post(Hello(body))
        elif op == Op.BYE:
            self.inbox.post(Bye(body))
        elif op == Op.STACKS_TAKEN:
            self.inbox.post(StacksTaken(body))
        else:
            raise ValueError(f"unknown op {op!r}")
        return {}

    def _write_failed(self, exc: OSError) -> None:
        """The collector could not store a batch (its thread): the loop will see it."""
        self.job.disk_full = self.job.disk_full or f"cannot store metrics: {exc.strerror}"

    def publish(self, state: dict[str, Any]) -> None:
        """What ``status`` requests answer: the state the loop saved last (replaced whole)."""
        self.published = state

    def metrics_counts(self) -> tuple[int, int]:
        """Records stored and batches rejected so far."""
        return self.collector.records, self.collector.rejected

    def stop_collector(self) -> None:
        """Store what has arrived (call once every process is gone), then close."""
        self.collector.stop()

    def stop(self) -> None:
        self.server.stop()
