"""Restart time after a failure: ``torchrun --standalone --nproc-per-node 2
--max-restarts 1`` against ``%%distributed --workers 2 --backend torch --max-restarts 1``,
started cold (``--no-pool``) and warm (the pool ready).

The same DDP program runs under each column: on its first attempt rank 1 records the
wall-clock time and exits 1 at step 10; the launcher ends the attempt and starts the
next, whose rank 0 records the time of its first finished step. The restart time is
the one minus the other: what a failure costs before training goes on (the program's
own imports, the process group, the first step included). Each round runs the columns
back to back, their order rotating; the benchmark reports each column's median and the
mean of the per-round ratios against torchrun with a 95% confidence interval (lower is
better). The raw per-round figures go to ``benchmarks/results/``.

    .venv/bin/python benchmarks/restart_time.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from launch_overhead import (  # noqa: E402  (a sibling script)
    bench_session,
    mean_with_interval,
    save_rounds,
    wait_for_pool,
)

PROGRAM = """\
import os, pathlib, sys, time
import torch
import torch.distributed as dist

marks = pathlib.Path(os.environ["RESTART_MARKS"])
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
retry = (marks / "failed").exists()
for step in range(20):
    optimizer.zero_grad()
    model(torch.ones(32, 64)).sum().backward()
    optimizer.step()
    if retry and step == 0 and dist.get_rank() == 0:
        (marks / "first_step").write_text(repr(time.time()))
    if not retry and step == 10 and dist.get_rank() == 1:
        (marks / "failed").write_text(repr(time.time()))
        sys.exit(1)
dist.destroy_process_group()
"""
COLUMNS = ("torchrun", "cold", "warm")
TORCHRUN_SECONDS = 90


def restart_seconds(marks: Path) -> float:
    return float((marks / "first_step").read_text()) - float((marks / "failed").read_text())


def run_torchrun(script: Path, marks: Path) -> float:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    argv = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script)]
    env = {**os.environ, "RESTART_MARKS": str(marks), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=TORCHRUN_SECONDS)
    except subprocess.TimeoutExpired:  # seen here once in 3 runs: the retry never stepped
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RoundFailed(f"torchrun still running after {TORCHRUN_SECONDS} s") from None
    if not (marks / "first_step").exists():  # an exit code alone is not fatal: torch's Gloo
        raise RoundFailed(f"torchrun did not restart: {err[-500:]}")  # teardown aborts
    return restart_seconds(marks)


class RoundFailed(RuntimeError):
    """A run that gave no figure: its round is left out, and counted."""


def run_distributed(shell, code: str, marks: Path, flags: str) -> float:
    line = f"--workers 2 --backend torch --max-restarts 1 --env RESTART_MARKS={marks} {flags}"
    shell.run_cell_magic("distributed", line, code)  # followed to its end, as a cell is
    return restart_seconds(marks)


def run_column(column: str, tmp: Path, code: str, script: Path, shell) -> float:
    marks = Path(tempfile.mkdtemp(dir=tmp))
    if column == "torchrun":
        return run_torchrun(script, marks)
    if column == "warm":
        wait_for_pool()
    return run_distributed(shell, code, marks, "--no-pool" if column == "cold" else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rounds: dict[str, list[float]] = {column: [] for column in COLUMNS}
    skipped = 0
    with bench_session(0, PROGRAM) as (tmp, code, script, shell):
        run_distributed(shell, code, Path(tempfile.mkdtemp(dir=tmp)), "")  # starts the pool
        for number in range(args.rounds):
            order = COLUMNS[number % 3 :] + COLUMNS[: number % 3]
            try:
                figures = {column: run_column(column, tmp, code, script, shell) for column in order}
            except RoundFailed as exc:
                skipped += 1
                print(f"round {number + 1} left out: {exc}", flush=True)
                continue
            for column, seconds in figures.items():
                rounds[column].append(seconds)
                print(f"round {number + 1} {column}: restart {seconds:.2f} s", flush=True)
    print(f"{len(rounds['torchrun'])} rounds ({skipped} left out)")
    print("median restart time (failure to the next first step):")
    for column in COLUMNS:
        print(f"  {column:<9} {statistics.median(rounds[column]):.2f} s")
    for column in ("cold", "warm"):
        ratios = [
            ours / hand for ours, hand in zip(rounds[column], rounds["torchrun"], strict=True)
        ]
        mean, low, high = mean_with_interval(ratios)
        print(f"  {column} / torchrun: {mean:.2f}x (95% CI {low:.2f}-{high:.2f})")
    save_rounds("restart_time", args, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
