"""Plain JSON models of jobs for the REST API (as dask-labextension's cluster models)."""

from __future__ import annotations

from typing import Any

from ..client.job import Job
from ..contract.spec import JobSpec
from ..contract.status import ProcessRecord, aggregate_images_per_sec

PROCESS_FIELDS = (
    "role",
    "index",
    "rank",
    "host",
    "address",
    "pid",
    "state",
    "exit_code",
    "step",
    "images_per_sec",
    "loss",
    "total_steps",
    "heartbeat",
    "started",
    "ended",
    "pooled",
)


def process_model(record: ProcessRecord) -> dict[str, Any]:
    return {"id": str(record.id), **{name: getattr(record, name) for name in PROCESS_FIELDS}}


def job_model(job: Job, processes: bool = True) -> dict[str, Any]:
    """What the sidebar shows of one job, and what a scale or a stop answers; with
    ``processes``, a model of each of its processes (the jobs list leaves them out: a
    128-rank job's are 44 KiB, and the sidebar polls the list every 2 s)."""
    status, spec = job.listed()
    if spec is None:
        spec = JobSpec(code="", name=job.id, workers=status.workers or 1)
    records = status.processes
    up = sum(1 for p in records if p.role in ("worker", "chief") and p.state == "running")
    model = {
        "id": job.id,
        "name": spec.name,
        "session": spec.session,  # an interactive session's name, else None
        "state": status.state,
        "backend": status.backend or spec.backend,
        "launcher": status.launcher or spec.launcher,
        "workers": status.workers or spec.workers,
        "workers_up": up,
        "ps": spec.ps,
        "scaling_to": status.scaling_to,
        "images_per_sec": aggregate_images_per_sec(records),
        "created": status.created,
        "running_at": status.running_at,
        "ended": status.ended,
        "error": status.error,
        "warnings": status.warnings,
        "generation": status.generation,
        "restarts": status.restarts,  # after failures (--max-restarts)
        "max_restarts": spec.max_restarts,
        "process_count": len(records),
    }
    if processes:
        model["processes"] = [process_model(p) for p in records]
    return model
