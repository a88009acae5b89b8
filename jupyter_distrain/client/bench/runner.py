"""Each bench configuration run as an ordinary job, its throughput read from the
reporting process's log; the rows saved beside the jobs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from ...contract.process import ProcessId
from ...contract.spec import JobSpec
from ...contract.store import jobs_root
from ..api import submit
from ..job import JobFailed
from .report import BenchRow, save
from .settings import PS_BACKENDS, BenchSettings, framework_of

_REPORTER = {
    "horovod": ProcessId("worker", 0),
    "tf": ProcessId("worker", 0),
    "ps-sync": ProcessId("worker", 0),  # the TF1 contract's chief
    "torch": ProcessId("worker", 0),
    "jax": ProcessId("worker", 0),
}
_RATE = re.compile(r"BENCH images_per_sec=([\d.]+)")


def label(backend: str, ps: int) -> str:
    """The backend as the table names it."""
    if backend in PS_BACKENDS:
        return f"ps {'sync' if backend == 'ps-sync' else 'async'} ({ps} ps)"
    return backend


class BenchFailed(RuntimeError):
    """A run that gave no images/sec: it failed, or ran past ``--timeout`` (and was
    stopped). One line, naming the run and its job."""


def run_one(settings: BenchSettings, backend: str, workers: int, ps: int) -> tuple[float, str]:
    """Run one configuration as a job; its images/sec and the job id. A run still going
    after ``settings.timeout`` seconds is stopped; :class:`BenchFailed` says so."""
    spec = JobSpec(
        code=settings.program(backend),
        workers=workers,
        ps=ps,
        backend="ps" if backend in PS_BACKENDS else backend,
        launcher=settings.launcher,
        name="bench",
        **settings.launcher_options,
    )
    job = submit(spec)
    run = f"bench run {label(backend, ps)} x{workers} ({job.id})"
    try:
        state = job.wait(timeout=settings.timeout)
    except TimeoutError:
        state = job.stop()
        raise BenchFailed(
            f"{run} still running after {settings.timeout:g} s (--timeout): {state}"
        ) from None
    except JobFailed as exc:
        raise BenchFailed(f"{run} failed: {exc.error} (its logs: logs {job.id})") from None
    reporter = _REPORTER.get(backend, ProcessId("chief", 0))
    match = _RATE.search(job.logs(reporter))
    if state != "succeeded" or match is None:
        raise BenchFailed(f"{run} {state}" + ("" if match else ": no images/sec in its log"))
    return float(match.group(1)), job.id


def run(
    settings: BenchSettings, progress: Callable[[str], None] = print
) -> tuple[list[BenchRow], Path]:
    """Run every configuration; returns the rows and the directory holding
    ``results.csv``, ``results.json`` and ``chart.svg``."""
    settings.validate()
    runs = settings.runs()
    rates: dict[tuple[str, int], tuple[float, str]] = {}
    frameworks: dict[str, str] = {}  # by the table's name of the backend
    for i, (backend, workers, ps) in enumerate(runs, 1):
        name = label(backend, ps)
        frameworks[name] = framework_of(backend)
        progress(f"bench {i}/{len(runs)}: {name}, {workers} worker(s) ...")
        rates[(name, workers)] = run_one(settings, backend, workers, ps)
        rate = rates[(name, workers)][0]
        progress(f"bench {i}/{len(runs)}: {name}, {workers} worker(s): {rate:,.0f} images/sec")
    rows = []
    for (name, workers), (rate, job) in rates.items():
        single = rates.get((name, 1))
        efficiency = rate / (workers * single[0]) if single and single[0] else None
        rows.append(BenchRow(name, workers, rate, efficiency, job, frameworks[name]))
    out = jobs_root(create=True) / "bench" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, mode=0o700)
    save(rows, settings, out)
    return rows, out
