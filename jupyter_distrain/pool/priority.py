"""Importing for the next run beside a running job, on CPU time the job leaves over.

A pool refilled only when a job ends makes a re-run started straight after it wait for
the imports, which then also compete with it for the cores. So the keeper refills as
soon as a job claims (one run ahead), and a process started while jobs run imports
lowered: put back to normal before it is handed to a job, and once no job runs.

Lowered is two things, because the kernel schedules in two levels:

- its session's *autogroup* at nice 19. With ``kernel.sched_autogroup_enabled`` each
  session (a pooled process's, each worker's) is a scheduling group of its own, and
  groups share the CPU fairly whatever their threads' policies: without this, an
  importing process took a third of the cores from a 2-rank job on 2 cores (its first
  step 1 s later). Any owner may set it back to 0.
- ``SCHED_IDLE`` for its threads, for where autogroups do not apply (processes in a
  cgroup): it runs only when no normal thread wants the CPU. Going back needs root,
  ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` of 20 (the kernel treats it as nice 20), so
  it is used only where that is allowed.

Where neither applies, nothing is lowered and the pool refills when a job ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from pathlib import Path

_NORMAL = os.sched_param(0)
AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")
LOWEST_NICE = 19
AUTOGROUP_RATE_SECONDS = 0.1  # the kernel's limit on autogroup changes without CAP_SYS_ADMIN
AUTOGROUP_RETRY_SECONDS = 2.0

log = logging.getLogger(__name__)


def may_use_idle_policy() -> bool:
    """Whether this process may put a ``SCHED_IDLE`` thread back to normal."""
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20


def autogroups() -> bool:
    """Whether the kernel groups scheduling by session."""
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


def can_lower() -> bool:
    """Whether a process can be lowered here and later put back."""
    return may_use_idle_policy() or autogroups()


def _set_autogroup_nice(pid: int | str, nice: int) -> None:
    """Set ``pid``'s autogroup nice. Without ``CAP_SYS_ADMIN`` the kernel takes one such
    change per machine every 100 ms and answers EAGAIN in between: an ordinary account's
    second change within that time (a restore right after a lower) is tried again."""
    deadline = time.monotonic() + AUTOGROUP_RETRY_SECONDS
    while True:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning(
                    "autogroup nice of %s not set to %d: the kernel kept refusing", pid, nice
                )
                return
            time.sleep(AUTOGROUP_RATE_SECONDS)
        except OSError:
            return


def lower(pid: int = 0) -> None:
    """Lower ``pid``, a session leader, and what it starts later (its threads and
    children inherit its policy): by default the calling process (a ``preexec_fn``), or
    one just started, from outside."""
    _set_autogroup_nice(pid or "self", LOWEST_NICE)
    if may_use_idle_policy():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(pid, os.SCHED_IDLE, _NORMAL)


def restore(pid: int) -> None:
    """Put ``pid`` (its autogroup, and each of its threads) back to normal."""
    _set_autogroup_nice(pid, 0)
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, _NORMAL)
