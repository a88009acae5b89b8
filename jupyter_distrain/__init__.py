"""jupyter_distrain: train a deep-learning model on many workers from a notebook cell.

The names below are imported on first use: a worker process (``python -m
jupyter_distrain.worker``) loads this package too, and needs none of the notebook's
side (the job client, the magics, ZeroMQ for following a job).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client.api import run, submit
    from .client.cml import await_workers, launch_workers, run_cluster, stop_workers
    from .client.job import Job, JobFailed
    from .contract.spec import JobSpec, SpecError
    from .worker.instrument import (
        CHECKPOINT_EXIT,
        checkpoint_dir,
        report,
        should_checkpoint,
        timed_step,
    )
    from .worker.strategy import strategy

from .version import __version__ as __version__  # the public attribute

_WHERE = {
    "run": "client.api",
    "submit": "client.api",
    "CHECKPOINT_EXIT": "worker.instrument",
    "checkpoint_dir": "worker.instrument",
    "report": "worker.instrument",
    "should_checkpoint": "worker.instrument",
    "timed_step": "worker.instrument",
    "Job": "client.job",
    "JobFailed": "client.job",
    "JobSpec": "contract.spec",
    "SpecError": "contract.spec",
    "strategy": "worker.strategy",
    "await_workers": "client.cml",
    "launch_workers": "client.cml",
    "run_cluster": "client.cml",
    "stop_workers": "client.cml",
}
__all__ = [
    "CHECKPOINT_EXIT",
    "Job",
    "JobFailed",
    "JobSpec",
    "SpecError",
    "await_workers",
    "checkpoint_dir",
    "launch_workers",
    "load_ipython_extension",
    "report",
    "run",
    "run_cluster",
    "should_checkpoint",
    "stop_workers",
    "strategy",
    "submit",
    "timed_step",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_distrain``: register ``%%distributed`` and ``%distributed``."""
    from .client.magics import register

    register(ipython)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter server extension (the REST API under ``/distrain/``)."""
    return [{"module": "jupyter_distrain.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension (``labextension/``, built into ``labextension``
    here); ``jupyter labextension develop --overwrite .`` links it for development."""
    return [{"src": "labextension", "dest": "jupyter-distrain-labextension"}]
