"""jupyter_distrain: train a deep-learning model on many workers from a notebook cell."""

from __future__ import annotations

from typing import Any

from .api import run, submit
from .instrument import CHECKPOINT_EXIT, checkpoint_dir, report, should_checkpoint, timed_step
from .job import Job, JobFailed
from .spec import JobSpec, SpecError
from .strategy import strategy
from .workers import await_workers, launch_workers, run_cluster, stop_workers

__version__ = "0.1.0"
__all__ = [
    "CHECKPOINT_EXIT",
    "checkpoint_dir",
    "report",
    "should_checkpoint",
    "timed_step",
    "Job",
    "JobFailed",
    "JobSpec",
    "SpecError",
    "await_workers",
    "launch_workers",
    "load_ipython_extension",
    "run",
    "run_cluster",
    "stop_workers",
    "strategy",
    "submit",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_distrain``: register ``%%distributed`` and ``%distributed``."""
    from .magics import register

    register(ipython)
