"""The warden: the supervisor's parent, whose only job is to clean up if the supervisor
is lost (SIGKILL, the OOM killer, a crash).

The process ``api.submit`` starts forks at once: the child is the supervisor,
the parent becomes this warden. The warden is a child subreaper, so when the
supervisor dies every process of the job it leaves behind (an MPI rank whose
mpirun died with the supervisor, a grandchild that ``setsid``-ed) becomes the
warden's child; the warden kills them all, and the job's pooled processes (children
of the pool's keeper, not ours: found by pid and start time in the job's state), marks
the job failed ("the
supervisor was lost") with every live row killed, and exits. What the job held
elsewhere (a Slurm allocation) its launcher releases (``LauncherKind.release_lost``). It holds no
socket, no lock and no thread: a few MiB of a freshly started interpreter.

Robustness
----------

- **The supervisor's warden.** `python -m jupyter_distrain.supervisor` forks:
  the child supervises, the parent (a child subreaper with no socket, thread or
  lock) waits for it. If the supervisor dies without a final state, the warden
  kills everything of the job that is left (orphans become its children),
  marks the state failed ("the supervisor was lost (killed by SIGKILL)") with
  every live row killed, and exits. PDEATHSIG alone reached only direct
  children; mpirun's ranks and setsid-ed grandchildren survived.
- **Exact liveness**: the job's `lock` file is flocked by the kernel before the
  supervisor is spawned and handed to it (`pass_fds`); `Job.status()` asks the
  lock, not a pid.
- **Launching is one process per loop turn**, so a stop, a signal or the
  startup deadline is handled during a launch; requests the machine cannot
  hold are refused before anything starts (`LauncherKind.check_capacity`).
- **A full disk**: 256 KiB set aside at start are given back when a write
  finds the disk full, so the final state and events are still written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

from ..contract.status import JobStatus, exit_text
from ..contract.store import JobDir
from ..processes import kill_descendants, kill_tree, reap_zombies

log = logging.getLogger(__name__)

SETTLE_SECONDS = 0.3  # keep sweeping until no new orphan appears for this long


def watch(job: JobDir, supervisor: int) -> int:
    """Wait for the supervisor; if it ended without a final state, clean up after it."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _: _forward(supervisor, number))
    _, wait_status = os.waitpid(supervisor, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    killed = sweep()
    status = job.read_state()
    killed += kill_pooled(status)
    if status.done:
        return 0
    release_lost(job)
    error = f"the supervisor was lost ({exit_text(code)}); every process of the job was stopped"
    log.error("%s (%d left behind)", error, len(killed))
    try:
        job.write_state(status.lost(error, row_state="killed"))
        job.append_event("supervisor_lost", code=code, killed=killed)
    except OSError as exc:  # a full disk, say: Job.status() still says the supervisor died
        log.error("cannot record the loss: %s", exc)
    return 1


def release_lost(job: JobDir) -> None:
    """The launcher's part of the clean-up (a Slurm allocation, say); logged if it fails."""
    from ..plugins import launcher_kind

    try:
        launcher_kind(job.read_spec().launcher).release_lost(job)
    except Exception:
        log.exception("the launcher could not release what the lost supervisor held")


def kill_pooled(status: JobStatus) -> list[int]:
    """Kill the job's pooled processes that still run here (their keeper may be gone
    too); the pids killed. A host's pooled processes end with their agent's session."""
    if status.launcher not in ("", "local"):
        return []
    rows = [row for row in status.processes if row.pooled]
    return [row.pid for row in rows if row.pid and kill_tree(row.pid, row.create_time)]


def _forward(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


def sweep() -> list[int]:
    """Kill and reap every descendant until none is left (orphans keep arriving while
    the processes they were below die)."""
    killed: list[int] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < SETTLE_SECONDS:
        children = kill_descendants()
        killed += children
        reap_zombies()
        if children:
            quiet_since = time.monotonic()
        time.sleep(0.05)
    return sorted(set(killed))
