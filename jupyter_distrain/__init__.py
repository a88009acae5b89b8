"""jupyter_distrain: train a deep-learning model on many workers from a notebook cell."""

from __future__ import annotations

from typing import Any

from .api import run, submit
from .job import Job, JobFailed
from .spec import JobSpec, SpecError

__version__ = "0.1.0"
__all__ = ["Job", "JobFailed", "JobSpec", "SpecError", "run", "submit", "load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_distrain``: register ``%%distributed`` and ``%distributed``."""
    from .magics import DistributedMagics

    ipython.register_magics(DistributedMagics)
