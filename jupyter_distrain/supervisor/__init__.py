"""The supervisor: one detached process per job, run as ``python -m jupyter_distrain.supervisor
JOB_DIR``. It owns the launcher and the backend, runs the job's event loop, serves the
control channel and writes the job store; it outlives the kernel that started it.

- ``core``: the event loop, the only writer of the job's state;
- ``events``: what other threads post to it;
- ``generation`` / ``table``: the processes of one launch, keyed by ProcessId;
- ``outcomes``: hello, bye, metrics and exits, and the backend's rules after each exit;
- ``scaling``, ``periodic``, ``termination``: the protocols the loop runs;
- ``channels``: the control and metrics channels and the worker environment.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

from ..backends.base import WorkerCommand
from ..store import JobDir
from .channels import Channels
from .core import Supervisor
from .events import Inbox, StopRequested

__all__ = ["Supervisor", "main"]

log = logging.getLogger("jupyter_distrain.supervisor")


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    job = JobDir(argv[0])
    logging.basicConfig(
        filename=job.supervisor_log,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log.info("supervisor for %s on %s, pid %d", job.id, socket.gethostname(), os.getpid())
    inbox = Inbox()
    channels = Channels(job, inbox)
    spec = job.read_spec()
    worker = WorkerCommand(
        [spec.python or sys.executable, "-m", "jupyter_distrain.worker"], channels.worker_env(spec)
    )
    supervisor = Supervisor(
        job, inbox, worker, counts=channels.metrics_counts, publish=channels.publish
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # posted: a handler never blocks
        signal.signal(sig, lambda *_: inbox.post(StopRequested("signal")))
    try:
        supervisor.run()
    finally:
        channels.stop_collector()  # after every process is gone: their last records are in
        supervisor.close()
        channels.stop()
    return 0
