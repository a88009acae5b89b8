"""The supervisor: one detached process per job, run as ``python -m jupyter_distrain.supervisor
JOB_DIR``. It owns the launcher and the backend, runs the job's event loop, serves the
control channel and writes the job store; it outlives the kernel that started it. A
kernel with pools on keeps one started ahead (``standby``: ``python -m
jupyter_distrain.supervisor.standby``), which the next job is handed to.

- ``core``: the event loop, the only writer of the job's state, and its one dispatch
  table (each part below says which events it handles: ``handlers()``);
- ``events``: what other threads post to it;
- ``generation`` / ``table``: the processes of one launch, keyed by ProcessId;
- ``outcomes``: hello, bye, metrics and exits, and the backend's rules after each exit;
- ``policy``: what becomes of the job, decided in one place from what the parts report
  (fail, restart from the last checkpoint, a new generation, stop, succeed);
- ``scaling``: resize in place or by checkpoint and a new generation;
- ``session``: an interactive session's cells; ``stacks``: every rank's stacks on request;
- ``periodic``: the duties the loop ticks (deadlines, memory, stall watch, saving);
- ``termination``: SIGTERM, ``--grace``, SIGKILL, through each process's handle;
- ``channels``: the control and metrics channels and the worker environment;
- ``standby``: a supervisor started ahead for the next job; ``warden``: the
  supervisor's parent, which cleans up if it dies.

How the supervisor works
------------------------

One small package; each file's first line says what it owns.

- `core.py`, the **event loop, the only writer of the job's state**. Other
  threads never touch the table or `JobStatus`: the control server's threads
  post `Hello`/`Bye`/`StopRequested`/`StopProcesses`, the metrics collector
  posts `Metric`, one waiter thread per launched process posts `Exited`, the
  signal handlers post `StopRequested` (the inbox is a `queue.SimpleQueue`,
  whose `put` is safe in a signal handler), and an elastic Horovod driver's
  threads ask for `StartProcess`. Requests that want an answer (`scale`,
  `StartProcess`) carry a `Future` that the loop completes (the caller gets the
  loop's exception, e.g. "cannot scale a job that is launching"). `status`
  requests are answered from the last state the loop published, never from
  live objects.
- `events.py`: the event types and the `Inbox`.
- `generation.py` + `table.py`: one launch of the job (launcher, backend plan,
  process table keyed by `ProcessId`), started and stopped together; scaling
  by checkpoint-and-restart replaces the generation. Exits are matched to the
  table by the launcher's handle object, so a late exit of an earlier
  generation is ignored without comparing pids.
- `outcomes.py`: hello (a member a helper started, i.e. an MPI rank, is
  adopted here through `launcher.adopt(pid)`), bye, metrics, exits, and after
  each exit the backend's `outcome()` rule.
- `scaling.py`: the scaling protocol (in place through the plan's services,
  else SIGUSR1 through each member's handle and restart on the first
  `CHECKPOINT_EXIT`).
- `periodic.py`: the duties the loop ticks, one small class each: startup
  deadline, memory limit, scale timeout, orphan reaping, saving live metrics.
- `termination.py`: SIGTERM to each tree, `--grace`, SIGKILL, wait.
- `channels.py`: the control and metrics channels and the worker environment.

**The supervisor reaches a process through its handle.** Every signal, memory
reading and liveness check goes through a `LaunchedProcess` a launcher returned
(`signal(sig, tree=)`, `memory_bytes()`, `poll()`, `wait()`), and sweeping
escaped grandchildren or reaping orphans is `launcher.sweep()` /
`launcher.reap()`. The local launcher keeps a `psutil.Process` per handle, so
a signal never reaches a reused pid. An ssh or Ray launcher implements the
same five verbs once.

**Backends return a plan.** `Backend.prepare(slots, network, worker) -> Plan`
is the one hook that starts anything (Horovod's rendezvous server, the
elastic driver); the plan carries the processes to start, the `Services` to
stop at the end (`start(host)`, `resize(n)`, `stop()`), and facts for
state.json (`info`: the TF cluster). `outcome(rows, ended)` decides the end.
Nothing is stashed on the backend between calls. The elastic runner gets a
typed `JobHost` (`start_process`, `backend_done`) instead of the backend.

**mpirun lives in the MPI path.** `mpirun_process()` returns one
`ProcessSpec` whose `hosts` maps the ranks it will start to their slots. The
table makes a row per rank (members) and one for mpirun (a helper, shown in
`JobStatus.helpers`, never in the rows views draw). Ranks name themselves
from their MPI rank (`Env.IDENTITY_FROM_MPI`), say hello with their pid (the
loop adopts them through the launcher) and bye with their code; ranks that
said no bye end with their mpirun.

**The contract** (`contract/process.py`): `ProcessId(role, index)` (the only place
that makes "worker-1"), every `JUPYTER_DISTRAIN_*` name (`Env`), the
channels a worker is given (`WorkerChannels`), `hello`/`bye` message shapes,
`CHECKPOINT_EXIT`. Control messages and metrics records both name their
process with `role` + `index`. The worker reads and writes the job directory
through `JobDir` (spec, pushed values, result, checkpoints, its own log).
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
from ..plugins import launcher_kind
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
    launcher = launcher_kind(spec.launcher)
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
