"""The job store's retention rule: what bounds the store, never a job that may run.

A finished job (its final state written, or its supervisor gone) is removed once it is
not among the newest ``JUPYTER_DISTRAIN_KEEP_JOBS`` finished jobs (200) or ended more
than ``JUPYTER_DISTRAIN_KEEP_DAYS`` days ago (30). A job whose supervisor holds its
lock, or that has not started one yet, is never removed, whatever its age. The rule is
applied at each submit; ``%distributed clean`` and ``DELETE /distrain/jobs`` remove
finished jobs on request.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import processes
from ..contract.process import Env
from ..contract.store import JobDir, find_job_dir, jobs_root, list_job_dirs
from ..timing import poll_until

log = logging.getLogger(__name__)

DEFAULT_KEEP_JOBS = 200
DEFAULT_KEEP_DAYS = 30.0
DAY_SECONDS = 86400.0
SETTLE_SECONDS = 5.0  # on request, how long a supervisor that wrote its end may take to exit


@dataclass(frozen=True)
class Retention:
    """How many finished jobs to keep, and for how long (``math.inf``: no bound)."""

    keep_jobs: float = DEFAULT_KEEP_JOBS
    keep_days: float = DEFAULT_KEEP_DAYS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Retention:
        """The rule the user set; a value that is not a number >= 0 is said once in a
        warning and the default kept."""
        environ = os.environ if environ is None else environ
        return cls(
            _setting(environ, Env.KEEP_JOBS, DEFAULT_KEEP_JOBS),
            _setting(environ, Env.KEEP_DAYS, DEFAULT_KEEP_DAYS),
        )


def _setting(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if math.isnan(value) or value < 0:
        log.warning("%s=%r is not a number >= 0 (or inf): keeping %g", name, raw, default)
        return default
    return value


def finished_at(job_dir: JobDir, settle: float = 0.0) -> float | None:
    """When the job ended, if it is finished and nothing of it may still run; else None.
    A job whose supervisor died without writing an end counts from its last state. A
    supervisor that wrote the final state is given ``settle`` seconds to exit."""
    alive = job_dir.supervisor_alive()
    if alive and settle > 0 and job_dir.read_state().done:
        alive = poll_until(lambda: job_dir.supervisor_alive() is False, settle) is False
    if alive is None and (job_dir.never_started() or job_dir.read_state().done):
        return job_dir.spec_file.stat().st_mtime
    if alive is not False:  # running, or no supervisor yet (being submitted)
        return None
    status = job_dir.read_state()
    if status.done and status.ended:
        return status.ended
    here = status.launcher in ("", "local")  # other launchers' pids are the hosts'
    if here and processes.any_running(status.pids()):
        return None  # its supervisor died, and something it recorded may still run
    try:
        return job_dir.state_file.stat().st_mtime
    except OSError:
        return job_dir.spec_file.stat().st_mtime


def expired(job_dirs: Iterable[JobDir], retention: Retention, settle: float = 0.0) -> list[JobDir]:
    """The finished jobs among ``job_dirs`` that the rule removes, oldest first."""
    now = time.time()
    finished = []
    for job_dir in job_dirs:
        try:
            ended = finished_at(job_dir, settle)
        except OSError:
            continue
        if ended is not None:
            finished.append((ended, job_dir))
    finished.sort(key=lambda pair: pair[0], reverse=True)  # newest first
    out = []
    for position, (ended, job_dir) in enumerate(finished):
        if position >= retention.keep_jobs or now - ended > retention.keep_days * DAY_SECONDS:
            out.append(job_dir)
    return out[::-1]


def remove(job_dir: JobDir, root: Path | None = None, settle: float = 0.0) -> bool:
    """Remove one finished job's directory (checked again right before); whether it went.
    Only a private directory directly under the jobs root is removed, never a link."""
    root = (root or jobs_root()).resolve()
    path = job_dir.path
    if path.is_symlink() or path.resolve().parent != root:
        return False
    try:
        job_dir.check_private()
        if finished_at(job_dir, settle) is None:
            return False
    except OSError:
        return False
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: safe against link swaps
    return not path.exists()


def apply(retention: Retention | None = None, root: Path | None = None) -> list[str]:
    """Remove what the rule says; the ids removed."""
    retention = retention or Retention.from_env()
    if math.isinf(retention.keep_jobs) and math.isinf(retention.keep_days):
        return []
    removed = [d.id for d in expired(list_job_dirs(root), retention) if remove(d, root)]
    if removed:
        log.info("retention: removed %d finished jobs: %s", len(removed), ", ".join(removed))
    return removed


def clean(
    job_ids: Iterable[str] = (),
    keep: int = 0,
    older_than_days: float | None = None,
    root: Path | None = None,
) -> list[str]:
    """Remove finished jobs on request: the ones named (all or none: a named job that
    is not finished raises ``ValueError`` and nothing is removed), else every finished
    job past the newest ``keep`` or ended more than ``older_than_days`` ago (with
    neither, every finished job). Returns the ids removed."""
    named = [find_job_dir(job_id, root) for job_id in job_ids]
    if named:
        running = [d.id for d in named if finished_at(d, SETTLE_SECONDS) is None]
        if running:
            raise ValueError(f"{', '.join(running)} not finished: stop it first; nothing removed")
        chosen = named
    else:
        rule = Retention(
            keep_jobs=keep if keep or older_than_days is None else math.inf,
            keep_days=math.inf if older_than_days is None else older_than_days,
        )
        chosen = expired(list_job_dirs(root), rule, SETTLE_SECONDS)
    return [d.id for d in chosen if remove(d, root, SETTLE_SECONDS)]
