"""Four real kernels submitting ``%%distributed --workers 2 --backend tf`` cells at once,
with the warm pool on and warm, a scale of one job and a stop of another in the middle:
every job gets its own processes, no pooled process is claimed twice, every job reaches
running while the others hold theirs, and every job ends with its own outcome."""

from __future__ import annotations

import psutil
import pytest

from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.store import list_job_dirs
from jupyter_distrain.pool import client
from jupyter_distrain.timing import poll_until

KERNELS = 4

GATED = """\
import os, sys, time
from jupyter_distrain import CHECKPOINT_EXIT, should_checkpoint
TAG = {tag!r}
print("up", TAG, flush=True)
while not os.path.exists({gate!r}):
    if should_checkpoint():
        sys.exit(CHECKPOINT_EXIT)
    time.sleep(0.1)
print("done", TAG, flush=True)
"""


@pytest.fixture
def pool_on(monkeypatch, jobs_root):
    """Pools on (set before the kernels start, which copy the environment); drained at
    teardown, their keepers gone."""
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "1")
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL_IDLE", "120")
    yield
    keepers = [psutil.Process(i.keeper) for i in client.list_pools(jobs_root)]
    client.drain(jobs_root)
    _gone, alive = psutil.wait_procs(keepers, timeout=20)
    assert alive == []


def _warm(kernel) -> client.PoolInfo:
    """One job from ``kernel`` (a pool serves jobs whose environment matches the one that
    asked for it: a kernel's), then the pool left to refill (as many as that job took)."""
    out = kernel.execute("%%distributed --workers 2 --backend tf\nprint('warm')", timeout=180)
    assert out.error is None, out.error_text

    def filled() -> client.PoolInfo | None:
        pools = client.list_pools()
        return pools[0] if pools and len(pools[0].idle) >= 2 and not pools[0].starting else None

    info = poll_until(filled, 180, 0.2)
    assert info is not None, client.list_pools()
    return info


def _jobs_by_tag(root) -> dict[str, Job]:
    jobs = {}
    for job_dir in list_job_dirs(root):
        job = Job(job_dir)
        for tag in (f"k{i}" for i in range(KERNELS)):
            if f"TAG = {tag!r}" in job.spec.code:
                jobs[tag] = job
    return jobs


def _pids(job: Job) -> list[tuple[int, bool]]:
    return [(p.pid, p.pooled) for p in job.status().processes if p.pid]


def test_four_kernels_submitting_at_once_each_get_their_own_processes(
    pool_on, new_kernel, jobs_root, tmp_path
):
    gate = tmp_path / "gate"
    kernels = [new_kernel() for _ in range(KERNELS)]
    idle = _warm(kernels[0]).idle
    cells = [
        k.submit(
            "%%distributed --workers 2 --backend tf --grace 3\n"
            + GATED.format(tag=f"k{i}", gate=str(gate))
        )
        for i, k in enumerate(kernels)
    ]

    def all_running() -> dict[str, Job] | None:
        jobs = _jobs_by_tag(jobs_root)
        if len(jobs) < KERNELS:
            return None
        ready = all(
            j.status().state == "running" and len(_pids(j)) == 2 and "up" in j.logs()
            for j in jobs.values()
        )
        return jobs if ready else None

    # no job waits on another's claim: all four run at once (none can end before the gate)
    jobs = poll_until(all_running, 150, 0.3)
    assert jobs is not None, {t: j.status() for t, j in _jobs_by_tag(jobs_root).items()}
    claimed: dict[str, list[tuple[int, bool]]] = {t: _pids(j) for t, j in jobs.items()}
    pooled_now = sorted(pid for rows in claimed.values() for pid, pooled in rows if pooled)
    assert set(idle) <= set(pooled_now), claimed  # the warm pool's processes were claimed

    # in the middle: scale k0 to 3 workers (a restart at its checkpoint), stop k1
    jobs["k0"].scale(3)
    assert jobs["k1"].stop() == "stopped"
    scaled = poll_until(
        lambda: (
            jobs["k0"].status().generation == 1
            and jobs["k0"].status().state == "running"
            and len(_pids(jobs["k0"])) == 3
        ),
        120,
        0.3,
    )
    assert scaled, jobs["k0"].status()
    claimed["k0 at 3"] = _pids(jobs["k0"])
    gate.touch()

    outs = [k.collect(cell, timeout=120) for k, cell in zip(kernels, cells, strict=True)]
    outcomes = {t: j.status() for t, j in jobs.items()}
    assert {t: s.state for t, s in outcomes.items()} == {
        "k0": "succeeded",
        "k1": "stopped",
        "k2": "succeeded",
        "k3": "succeeded",
    }, outs
    assert outcomes["k0"].workers == 3 and len(outcomes["k0"].processes) == 3
    for i in (0, 2, 3):
        assert outs[i].error is None, outs[i].error_text
        assert f"done k{i}" in outs[i].stdout, outs[i].stdout

    # every job its own processes, and no pooled process claimed twice
    owners: dict[int, list[str]] = {}
    for tag, rows in claimed.items():
        for pid, _pooled in rows:
            owners.setdefault(pid, []).append(tag)
    shared = {pid: tags for pid, tags in owners.items() if len(tags) > 1}
    assert shared == {}, claimed
    pooled = [pid for rows in claimed.values() for pid, is_pooled in rows if is_pooled]
    assert len(pooled) == len(set(pooled)), claimed
