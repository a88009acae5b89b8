"""The seed's API: Cloudera CML's ``launch_workers`` / ``await_workers`` / ``stop_workers``
and ``cdsw_tensorflow_utils.run_cluster``, over the same engine as the magic.

A worker id is ``"<job-id>/<index>"``: each ``launch_workers`` call is one job
of the ``plain`` backend (independent copies of a program), so the job
directory, logs, ``%distributed status`` and stop work as for any other job.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .api import submit
from .cellcheck import defines_seed_run
from .job import Job
from .spec import JobSpec, SpecError
from .store import FINAL_STATES

POLL_SECONDS = 0.1


def _split(worker_id: str) -> tuple[str, int]:
    job_id, sep, index = worker_id.rpartition("/")
    if not sep or not index.isdigit():
        raise ValueError(f"not a worker id: {worker_id!r} (expected '<job-id>/<index>')")
    return job_id, int(index)


def launch_workers(
    n: int,
    cpu: float | None = None,
    memory: float | None = None,
    script: str | None = None,
    code: str | None = None,
    launcher: str = "local",
    env: Mapping[str, str] | None = None,
    name: str = "workers",
    timeout: float = 120.0,
) -> list[dict[str, Any]]:
    """Start ``n`` workers running ``script`` (a path, resolved on each worker, as in CML)
    or ``code``. Returns one dict per worker with its ``id``."""
    if (script is None) == (code is None):
        raise SpecError("launch_workers needs exactly one of script= or code=")
    spec = JobSpec(
        code=code if code is not None else "",
        script=str(Path(script).expanduser().absolute()) if script is not None else None,
        workers=n,
        backend="plain",
        launcher=launcher,
        cpu=cpu,
        memory=memory,
        env=dict(env or {}),
        name=name,
        timeout=timeout,
    )
    job = submit(spec)
    return [{"id": f"{job.id}/{i}", "job": job.id, "index": i} for i in range(n)]


def _worker_view(worker_id: str, process: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": worker_id,
        "ip_address": process.get("address") or None,
        "host": process.get("host"),
        "pid": process.get("pid"),
        "state": process.get("state"),
        "exit_code": process.get("exit_code"),
    }


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
    deadline = time.monotonic() + timeout_seconds
    while True:
        states = {job_id: job.status() for job_id, job in jobs.items()}
        workers, failures, pending = [], [], []
        for worker_id, job_id, index in wanted:
            procs = {
                p["index"]: p for p in states[job_id].get("processes", []) if p["role"] == "worker"
            }
            proc = procs.get(index)
            if proc is None:
                pending.append(worker_id)
                continue
            ended = proc["state"] in ("exited", "killed")
            if wait_for_completion:
                if not ended:
                    pending.append(worker_id)
                elif proc["exit_code"] == 0:
                    workers.append(_worker_view(worker_id, proc))
                else:
                    failures.append(worker_id)
            elif proc["state"] == "running" or (ended and proc["exit_code"] == 0):
                workers.append(_worker_view(worker_id, proc))
            elif ended or states[job_id]["state"] in FINAL_STATES:
                failures.append(worker_id)
            else:
                pending.append(worker_id)
        if not pending or time.monotonic() > deadline:
            return {"workers": workers, "failures": failures + pending}
        time.sleep(POLL_SECONDS)


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
        job.stop_processes([f"worker-{i}" for i in indexes])
        procs = {p["index"]: p for p in job.status()["processes"] if p["role"] == "worker"}
        stopped += [_worker_view(f"{job_id}/{i}", procs.get(i, {})) for i in indexes]
    return stopped


def run_cluster(
    n_workers: int,
    n_ps: int,
    cpu: float | None = None,
    memory: float | None = None,
    worker_script: str = "train.py",
    timeout_seconds: float = 60,
    launcher: str = "local",
) -> tuple[dict[str, list[str]], str]:
    """Start a TensorFlow cluster running ``worker_script`` as in Cloudera's
    ``cdsw_tensorflow_utils.run_cluster``: the script defines
    ``run(cluster, server, task_index)``; each ps joins its server and each worker
    calls ``run``. Returns ``(cluster_spec, session_addr)`` once every task is up:
    the cluster as a dict (``tf.train.ClusterSpec(cluster_spec)`` makes the object)
    and the chief's (worker 0's) ``grpc://`` address.
    """
    path = Path(worker_script).expanduser()
    try:
        code = path.read_text()
    except OSError as exc:
        raise SpecError(f"worker_script: cannot read {worker_script}: {exc.strerror}") from None
    if not defines_seed_run(code):
        raise SpecError(
            f"worker_script: {worker_script} does not define run(cluster, server, task_index)"
        )
    spec = JobSpec(
        code=code,
        workers=n_workers,
        ps=n_ps,
        backend="ps",
        launcher=launcher,
        cpu=cpu,
        memory=memory,
        name="cluster",
        timeout=timeout_seconds,
    )
    job = submit(spec)
    deadline = time.monotonic() + timeout_seconds
    while True:
        status = job.status()
        if status["state"] == "running" or (
            status["state"] in FINAL_STATES and "cluster" in status
        ):
            break
        if status["state"] in FINAL_STATES or time.monotonic() > deadline:
            job.stop()
            raise RuntimeError(
                f"cluster job {job.id} did not come up: {status.get('error') or status['state']}"
            )
        time.sleep(POLL_SECONDS)
    cluster = status["cluster"]
    return cluster, f"grpc://{cluster['worker'][0]}"
