"""The supervisor: one detached process per job, run as ``python -m jupyter_distrain.supervisor
JOB_DIR``. It owns the launcher and the backend, runs the job's event loop, serves the
control channel and writes the job store; it outlives the kernel that started it. A
kernel with pools on keeps one started ahead (``standby``: ``python -m
jupyter_distrain.supervisor.standby``), which the next job is handed to.

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

from .. import processes
from ..backends.base import WorkerCommand
from ..contract.store import JobDir
from ..launchers.isolation import IsolationFailed
from ..plugins import LAUNCHERS, load_plugin
from . import warden
from .channels import Channels
from .core import Supervisor
from .events import Inbox, StopRequested

__all__ = ["Supervisor", "main"]

log = logging.getLogger("jupyter_distrain.supervisor")


def main(argv: list[str] | None = None) -> int:
    """``JOB_DIR [--lock-fd N]``: fork; the child supervises the job, this process
    becomes its warden. ``N`` is the job's lock, taken by whoever started us."""
    argv = argv if argv is not None else sys.argv[1:]
    job = JobDir(argv[0]).check_private()
    lock_fd = int(argv[2]) if argv[1:2] == ["--lock-fd"] else job.hold_lock()
    logging.basicConfig(
        filename=job.supervisor_log,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    processes.become_subreaper()
    child = os.fork()
    if child:
        os.close(lock_fd)  # the supervisor alone holds it: the lock dies with it
        return warden.watch(job, child)
    os.set_inheritable(lock_fd, False)
    try:
        supervise(job)
    except BaseException:
        log.exception("supervisor crashed")
        os._exit(1)
    os._exit(0)  # the warden's copy of everything above is not ours to clean up


def supervise(job: JobDir) -> None:
    log.info("supervisor for %s on %s, pid %d", job.id, socket.gethostname(), os.getpid())
    spec = job.read_spec()
    job.keep_reserve()
    processes.raise_open_files_limit()  # before the channels listen
    launcher = load_plugin(LAUNCHERS, spec.launcher)
    try:
        warning = launcher.isolate_job(spec)
    except IsolationFailed as exc:  # no process started: the job fails, with why
        log.error("%s", exc)
        job.write_state(job.read_state().lost(f"{exc}; nothing was started"))
        job.append_event("state", state="failed", error=str(exc))
        return
    inbox = Inbox()
    channels = Channels(job, inbox, host=launcher.channel_host(spec))
    worker = WorkerCommand(
        [spec.python or sys.executable, "-m", "jupyter_distrain.worker"], channels.worker_env(spec)
    )
    supervisor = Supervisor(
        job,
        inbox,
        worker,
        counts=channels.metrics_counts,
        publish=channels.publish,
        isolation_warning=warning,
    )
    if warning:
        log.warning("%s", warning)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # posted: a handler never blocks
        signal.signal(sig, lambda *_: inbox.post(StopRequested("signal")))
    try:
        supervisor.run()
    finally:
        channels.stop_collector()  # after every process is gone: their last records are in
        supervisor.close()
        channels.stop()
