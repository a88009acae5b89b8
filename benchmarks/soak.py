"""Soak: many short jobs back to back with the warm pool on leave the machine as they
found it.

``--jobs`` tiny ``--backend tf`` jobs of 2 workers run one after another in a private
jobs root (``JUPYTER_DISTRAIN_KEEP_JOBS`` set low, so the store's retention bound shows).
Each job runs a ``tf.function`` that AutoGraph converts (which writes a
``__autograph_generated_file*.py`` to the temp directory); every 10th job is stopped
mid-run and every 10th (another) exits 1, so what killed or failed workers leave shows.
At jobs 1, 50, 100, 200 (those within ``--jobs``, with the half-way job and the last
one), once the pool has refilled, it prints: processes on the machine and those of this
soak (job processes, the pool keeper and its idle processes), the keeper's open file
descriptors and resident memory, ``/tmp``'s entries and size and the AutoGraph files in
it, and the store's size and job count. It ends with a verdict per figure: bounded if
the last checkpoint is within the stated tolerance of the baseline (job 50, or the
half-way job for fewer than 100 jobs), else growing (the store's job count: at most
``--keep-jobs`` + 2); it exits 1 if any figure grows. Run it where nobody edits the
package meanwhile: a pool serves only the code it imported, so an edit drains it.

    .venv/bin/python benchmarks/soak.py [--jobs 200] [--keep-jobs 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from launch_overhead import wait_for_pool

PROGRAM = """\
import os, sys, time
import tensorflow as tf

@tf.function
def step(x):
    if x > 0:  # a tensor condition: AutoGraph converts this function (and writes a file)
        return x * 2.0
    return x - 1.0

print("value", float(step(tf.constant(1.5))), flush=True)
if {fail}:
    sys.exit(1)
time.sleep({sleep})
"""

AUTOGRAPH_GLOB = "__autograph_generated_file*.py"
MIB = 2**20


@dataclass(frozen=True)
class Figure:
    """One figure the soak tracks: how to read it and how much it may move."""

    name: str
    read: Callable[[dict], float]
    slack: float  # absolute tolerance over the baseline
    ratio: float = 0.0  # and a relative one (of the baseline)
    shared: bool = False  # machine-wide: other users' processes and files move it too
    cap: float | None = None  # instead of the baseline: a fixed bound


def soak_processes(root: Path) -> list[psutil.Process]:
    """This soak's processes: its descendants (supervisors, workers, the pool keeper and
    its idle processes) and any other whose environment names its jobs root (one that
    outlived its parent)."""
    marker = f"JUPYTER_DISTRAIN_ROOT={root}".encode()
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid() or proc.pid in found:
            continue
        with contextlib.suppress(OSError, psutil.Error):
            if marker in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
                found[proc.pid] = proc
    return list(found.values())


def tree_size(path: Path) -> tuple[int, int]:
    """(top-level entries, bytes under ``path``), skipping what vanishes meanwhile."""
    total = 0
    entries = 0
    with contextlib.suppress(OSError):
        entries = len(os.listdir(path))
    for base, _dirs, files in os.walk(path, onerror=lambda _e: None):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
    return entries, total


def measure(root: Path, tmp: Path) -> dict:
    """The figures now."""
    from jupyter_distrain.contract.store import list_job_dirs
    from jupyter_distrain.pool import client

    pools = client.list_pools()
    keeper_fds = keeper_rss = -1.0
    if pools:
        with contextlib.suppress(OSError, psutil.Error):
            keeper_fds = len(os.listdir(f"/proc/{pools[0].keeper}/fd"))
            keeper_rss = psutil.Process(pools[0].keeper).memory_info().rss / MIB
    tmp_entries, tmp_bytes = tree_size(tmp)
    store_entries, store_bytes = tree_size(root)
    return {
        "machine procs": len(psutil.pids()),
        "soak procs": len(soak_processes(root)),
        "keeper": pools[0].keeper if pools else 0,
        "keeper fds": keeper_fds,
        "keeper RSS MiB": keeper_rss,
        "/tmp entries": tmp_entries,
        "/tmp MiB": tmp_bytes / MIB,
        "autograph files": len(list(tmp.glob(AUTOGRAPH_GLOB))),
        "store jobs": len(list_job_dirs(root)),
        "store MiB": store_bytes / MIB,
    }


def figures(keep_jobs: int) -> list[Figure]:
    """The figures and their tolerances. The store holds the newest ``keep_jobs``
    finished jobs, the one just submitted, and the one before it while its supervisor is
    still exiting (retention, applied at submit, never removes a job that may run)."""
    return [
        Figure("machine procs", lambda m: m["machine procs"], 30, shared=True),
        Figure("soak procs", lambda m: m["soak procs"], 1),
        Figure("keeper fds", lambda m: m["keeper fds"], 2),
        Figure("keeper RSS MiB", lambda m: m["keeper RSS MiB"], 5, 0.10),
        Figure("/tmp entries", lambda m: m["/tmp entries"], 20, shared=True),
        Figure("/tmp MiB", lambda m: m["/tmp MiB"], 50, 0.10, shared=True),
        Figure("autograph files", lambda m: m["autograph files"], 0),
        Figure("store jobs", lambda m: m["store jobs"], 0, cap=keep_jobs + 2),
        Figure("store MiB", lambda m: m["store MiB"], 1, 0.25),
    ]


def checkpoints(jobs: int) -> tuple[list[int], int]:
    """The jobs after which the figures are read, and the baseline among them."""
    baseline = 50 if jobs >= 100 else max(1, jobs // 2)
    points = sorted({p for p in (1, 50, 100, 200, baseline, jobs) if p <= jobs})
    return points, baseline


def run_job(index: int, sleep: float) -> str:
    """Job ``index`` (from 1): every 10th (at 5) stopped mid-run, every 10th (at 7)
    exits 1, the rest succeed; its outcome."""
    from jupyter_distrain import JobFailed, JobSpec, submit
    from jupyter_distrain.timing import poll_until

    stopped, failing = index % 10 == 5, index % 10 == 7
    code = PROGRAM.format(fail=failing, sleep=30 if stopped else sleep)
    job = submit(JobSpec(code=code, workers=2, backend="tf"))
    if stopped:
        printed = lambda: all("value" in job.logs(p.id) for p in job.status().processes)  # noqa: E731
        poll_until(lambda: job.status().state == "running" and printed(), 120, 0.1)
        job.stop()
    with contextlib.suppress(JobFailed):
        job.wait(timeout=180)
    return job.status().state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--keep-jobs", type=int, default=20, help="JUPYTER_DISTRAIN_KEEP_JOBS")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each job sleeps")
    args = parser.parse_args()
    tmp = Path(tempfile.gettempdir())
    points, baseline = checkpoints(args.jobs)
    tracked = figures(args.keep_jobs)
    with tempfile.TemporaryDirectory(prefix="soak-") as private:
        root = Path(private) / "jobs"
        os.environ.update(
            JUPYTER_DISTRAIN_ROOT=str(root),
            JUPYTER_DISTRAIN_POOL="1",
            JUPYTER_DISTRAIN_KEEP_JOBS=str(args.keep_jobs),
        )
        rows: dict[int, dict] = {0: measure(root, tmp)}
        outcomes: dict[str, int] = {}
        started = time.time()
        try:
            for index in range(1, args.jobs + 1):
                state = run_job(index, args.sleep)
                outcomes[state] = outcomes.get(state, 0) + 1
                if index in points:
                    with contextlib.suppress(RuntimeError):  # no pool: measured as is
                        wait_for_pool()
                    rows[index] = measure(root, tmp)
                    print(f"job {index}: {rows[index]} ({time.time() - started:.0f} s)", flush=True)
        finally:
            from jupyter_distrain.pool import client

            client.drain()
    print()
    print(f"{args.jobs} jobs in {time.time() - started:.0f} s; outcomes {outcomes}")
    print(f"{'figure':<18}" + "".join(f"{'before' if j == 0 else f'job {j}':>10}" for j in rows))
    for figure in tracked:
        cells = "".join(f"{figure.read(r):>10.1f}" for r in rows.values())
        print(f"{figure.name:<18}{cells}")
    keepers = {r["keeper"] for j, r in rows.items() if j}
    print(f"{'keeper pid':<18}" + "".join(f"{r['keeper']:>10}" for r in rows.values()))
    print()
    growing = []
    base, last = rows[baseline], rows[args.jobs]
    for figure in tracked:
        limit = figure.read(base) + figure.slack + figure.ratio * abs(figure.read(base))
        against = f"job {baseline} {figure.read(base):.1f} (tolerance +{figure.slack:g}"
        against += f" +{figure.ratio:.0%})" if figure.ratio else ")"
        if figure.cap is not None:
            limit, against = figure.cap, f"at most {figure.cap:g}"
        bounded = figure.read(last) <= limit
        note = " (machine-wide: other users move it too)" if figure.shared else ""
        print(
            f"{figure.name}: {'bounded' if bounded else 'GROWING'}: job {args.jobs} "
            f"{figure.read(last):.1f} vs {against}{note}"
        )
        if not bounded:
            growing.append(figure.name)
    if len(keepers) > 1:
        print(f"note: the pool keeper changed during the soak ({sorted(keepers)})")
    if growing:
        print(f"growing: {', '.join(growing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
