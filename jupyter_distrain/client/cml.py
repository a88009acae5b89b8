"""The seed's API: Cloudera CML's ``launch_workers`` / ``await_workers`` / ``stop_workers``
and ``cdsw_tensorflow_utils.run_cluster``, over the same engine as the magic.

A worker id is ``"<job-id>/<index>"``: each ``launch_workers`` call is one job
of the ``plain`` backend (independent copies of a program), so the job
directory, logs, ``%distributed status`` and stop work as for any other job.

The seed API
------------

`launch_workers` makes one `plain` job per call; a worker id is
`"<job-id>/<index>"`. The script path is resolved on the worker (CML's
semantics, where the script lives in the project the worker mounts), so a bad
path is not refused up front: that worker never says hello and `await_workers`
lists it in `failures`. The worker bootstrap says hello only after it has
loaded and compiled the program, so "running" means "the program started".
`run_cluster` reads the script locally, refuses one without `run(...)`, starts
a seed-mode ps job, waits until every task is up and returns the cluster as a
plain dict (`tf.train.ClusterSpec(cluster)` makes the object, and the kernel
need not import TensorFlow) with `grpc://<worker 0>`.
`stop_workers` stops the named processes only; naming every live worker stops
the job as a whole (`stopped`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .. import plugins
from ..contract.cellcheck import defines_tf1_run
from ..contract.process import ProcessId
from ..contract.spec import JobSpec, SpecError
from ..contract.status import ProcessRecord
from ..timing import poll_until
from .api import submit
from .job import Job

POLL_SECONDS = 0.1
T = TypeVar("T")
WORKER_FIELDS = ("ip_address", "host", "pid", "state", "exit_code")


def _split(worker_id: str) -> tuple[str, int]:
    job_id, sep, index = worker_id.rpartition("/")
    if not sep or not index.isdigit():
        raise ValueError(f"not a worker id: {worker_id!r} (expected '<job-id>/<index>')")
    return job_id, int(index)


_SET_BY_LAUNCHERS = {"placement", "pool_socket", "gpu_ids"}


def _spec(**fields: Any) -> JobSpec:
    """A JobSpec from these fields and launcher options; an unknown one is a
    :class:`SpecError` naming it."""
    known = {f.name for f in dataclasses.fields(JobSpec)} | set(plugins.launcher_options())
    unknown = sorted(set(fields) - known | (set(fields) & _SET_BY_LAUNCHERS))
    if unknown:
        raise SpecError(f"unknown option {unknown[0]!r} (options are JobSpec fields: hosts=...)")
    return JobSpec(**fields)


def launch_workers(
    n: int,
    cpu: float | None = None,
    memory: float | None = None,
    script: str | None = None,
    gpus: int = 0,
    code: str | None = None,
    launcher: str = "local",
    env: Mapping[str, str] | None = None,
    name: str = "workers",
    timeout: float = 120.0,
    **launcher_options: Any,
) -> list[dict[str, Any]]:
    """Start ``n`` workers running ``script`` (a path, resolved on each worker, as in CML)
    or ``code``. Returns one dict per worker with its ``id``. ``launcher_options`` are the
    launcher's settings, as JobSpec fields (``hosts="h1:2,h2:2", ssh_port=2222``, ...)."""
    if (script is None) == (code is None):
        raise SpecError("launch_workers needs exactly one of script= or code=")
    spec = _spec(
        code=code if code is not None else "",
        script=str(Path(script).expanduser().absolute()) if script is not None else None,
        workers=n,
        backend="plain",
        launcher=launcher,
        cpu=cpu,
        memory=memory,
        gpus=gpus,
        env=dict(env or {}),
        name=name,
        timeout=timeout,
        **launcher_options,
    )
    job = submit(spec)
    return [{"id": f"{job.id}/{i}", "job": job.id, "index": i} for i in range(n)]


def _worker_view(worker_id: str, process: ProcessRecord | None) -> dict[str, Any]:
    """What the seed API says about one worker (every field None when it has no row)."""
    if process is None:
        return {"id": worker_id, **dict.fromkeys(WORKER_FIELDS)}
    return {
        "id": worker_id,
        "ip_address": process.address or None,
        "host": process.host,
        "pid": process.pid,
        "state": process.state,
        "exit_code": process.exit_code,
    }


def _poll(read: Callable[[], T], settled: Callable[[T], bool], seconds: float) -> T:
    """Read every ``POLL_SECONDS`` until ``settled(value)`` or ``seconds`` have passed;
    the last value read."""
    last: list[T] = []

    def check() -> bool:
        last[:] = [read()]
        return settled(last[0])

    poll_until(check, seconds, POLL_SECONDS)
    return last[0]


def _classify(process: ProcessRecord | None, job_ended: bool, completion: bool) -> str:
    """``"ok"``, ``"failed"`` or ``"pending"``: whether a worker is up (or, waiting for
    ``completion``, has exited 0), will never be, or may still be."""
    if process is None:
        return "pending"
    ended = process.state in ("exited", "killed")
    if completion:
        if not ended:
            return "pending"
        return "ok" if process.exit_code == 0 else "failed"
    if process.state == "running" or (ended and process.exit_code == 0):
        return "ok"
    return "failed" if ended or job_ended else "pending"


def await_workers(
    ids: Iterable[str], wait_for_completion: bool = False, timeout_seconds: float = 60
) -> dict[str, list[Any]]:
    """Wait until every worker is running (or, with ``wait_for_completion``, has ended).

    Returns ``{"workers": [{"id", "ip_address", ...}], "failures": [ids]}``: a
    worker that did not start (or, when waiting for completion, did not exit 0)
    within ``timeout_seconds`` is a failure.
    """
    wanted = [(worker_id, *_split(worker_id)) for worker_id in ids]
    jobs = {job_id: Job.attach(job_id) for _, job_id, _ in wanted}

    def roll_call() -> dict[str, list[Any]]:
        statuses = {job_id: job.status() for job_id, job in jobs.items()}
        found: dict[str, list[Any]] = {"ok": [], "failed": [], "pending": []}
        for worker_id, job_id, index in wanted:
            process = statuses[job_id].process(ProcessId("worker", index))
            verdict = _classify(process, statuses[job_id].done, wait_for_completion)
            view = _worker_view(worker_id, process) if verdict == "ok" else worker_id
            found[verdict].append(view)
        return found

    found = _poll(roll_call, lambda f: not f["pending"], timeout_seconds)
    return {"workers": found["ok"], "failures": found["failed"] + found["pending"]}


def stop_workers(*ids: str | Iterable[str]) -> list[dict[str, Any]]:
    """Stop the given workers (ids, or lists of ids). A job all of whose workers are
    named is stopped whole. Returns the workers' views after stopping."""
    flat: list[str] = []
    for item in ids:
        flat += [item] if isinstance(item, str) else list(item)
    by_job: dict[str, list[int]] = {}
    for worker_id in flat:
        job_id, index = _split(worker_id)
        by_job.setdefault(job_id, []).append(index)
    stopped = []
    for job_id, indexes in by_job.items():
        job = Job.attach(job_id)
        processes = [ProcessId("worker", i) for i in indexes]
        job.stop_processes(processes)
        status = job.status()
        stopped += [_worker_view(f"{job_id}/{p.index}", status.process(p)) for p in processes]
    return stopped


def run_cluster(
    n_workers: int,
    n_ps: int,
    cpu: float | None = None,
    memory: float | None = None,
    worker_script: str = "train.py",
    gpus: int = 0,
    timeout_seconds: float = 60,
    launcher: str = "local",
    **launcher_options: Any,
) -> tuple[dict[str, list[str]], str]:
    """Start a TensorFlow cluster running ``worker_script`` as in Cloudera's
    ``cdsw_tensorflow_utils.run_cluster``: the script defines
    ``run(cluster, server, task_index)``; each ps joins its server and each worker
    calls ``run``. Returns ``(cluster_spec, session_addr)`` once every task is up:
    the cluster as a dict (``tf.train.ClusterSpec(cluster_spec)`` makes the object)
    and the chief's (worker 0's) ``grpc://`` address. ``launcher_options`` as for
    :func:`launch_workers`.
    """
    path = Path(worker_script).expanduser()
    try:
        code = path.read_text()
    except OSError as exc:
        raise SpecError(f"worker_script: cannot read {worker_script}: {exc.strerror}") from None
    if not defines_tf1_run(code):
        raise SpecError(
            f"worker_script: {worker_script} does not define run(cluster, server, task_index)"
        )
    spec = _spec(
        code=code,
        workers=n_workers,
        ps=n_ps,
        backend="ps",
        launcher=launcher,
        cpu=cpu,
        memory=memory,
        gpus=gpus,
        name="cluster",
        timeout=timeout_seconds,
        **launcher_options,
    )
    job = submit(spec)
    status = _poll(job.status, lambda s: s.state == "running" or s.done, timeout_seconds)
    if status.state != "running" and not (status.done and "cluster" in status.backend_info):
        job.stop()
        raise RuntimeError(f"cluster job {job.id} did not come up: {status.error or status.state}")
    cluster = status.backend_info["cluster"]
    return cluster, f"grpc://{cluster['worker'][0]}"
