"""What a claimed process started and left behind: the keeper is a child subreaper, so
those orphans become its children; they are killed when the job's process ends, and
collected once they have ended."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from ..contract.process import Env
from ..processes import reap_zombies, signal_tree


def orphans(pool_pids: set[int]) -> list[psutil.Process]:
    """Our children that are not pool processes: what a job's process left to us."""
    return [child for child in psutil.Process().children() if child.pid not in pool_pids]


def kill_orphans_of(ended_pid: int, job: str, pool_pids: set[int]) -> None:
    """Kill what belongs to the ended process's job: its session, or its job directory
    (``job``) in the environment."""
    for child in orphans(pool_pids):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(child.pid) == ended_pid or (
                job and child.environ().get(Env.JOB_DIR) == job
            ):
                signal_tree(child, signal.SIGKILL)


def reap_orphans(pool_pids: set[int]) -> None:
    """Collect orphans that have ended (the pool's own processes are left to ``Popen``)."""
    reap_zombies(keep=pool_pids)
