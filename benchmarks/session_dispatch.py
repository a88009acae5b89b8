"""A session's cell against a warm job: how soon every rank runs the cell, and how soon
the cell returns.

Each round runs, back to back and in alternating order, the same one-line cell
(``mark = time.time()``, written to a file per rank) two ways on ``--workers`` torch
ranks on this machine:

- ``session``: a later cell of a running ``%%distributed --session`` (its ranks at their
  prompt, the process group up since the session's first cell);
- ``warm job``: a ``%%distributed --backend torch`` job with the warm pool ready (the
  fastest a job starts: ranks forked ahead with torch imported).

Two figures per run: *dispatch*, from the magic's call to the last rank running the
cell's first line, and *round trip*, to the magic's return (every rank's answer in, the
output printed). The benchmark reports each column's median and the mean of the
per-round ratios session / warm job with a 95% confidence interval. The raw per-round
figures go to ``benchmarks/results/``.

    .venv/bin/python benchmarks/session_dispatch.py [--rounds 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from launch_overhead import (  # noqa: E402  (a sibling script)
    bench_session,
    mean_with_interval,
    save_rounds,
    wait_for_pool,
)

START = "import torch.distributed as dist\ndist.init_process_group()\n"
CELL = (
    "import os, pathlib, time\n"
    "pathlib.Path({marks!r}, os.environ['JUPYTER_DISTRAIN_RANK']).write_text(repr(time.time()))\n"
)
COLUMNS = ("session", "warm job")


def run(shell, line: str, code: str, workers: int) -> tuple[float, float]:
    """(dispatch, round trip) in seconds of one cell."""
    marks = Path(tempfile.mkdtemp())
    printed = io.StringIO()
    started = time.time()
    with contextlib.redirect_stdout(printed):
        shell.run_cell_magic("distributed", line, CELL.format(marks=str(marks)) + code)
    returned = time.time()
    times = [float(p.read_text()) for p in marks.iterdir()]
    if len(times) != workers:
        raise RuntimeError(f"{len(times)} of {workers} ranks ran the cell:\n{printed.getvalue()}")
    return max(times) - started, returned - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    workers = args.workers
    session = f"--session bench --workers {workers} --backend torch"
    job = f"--workers {workers} --backend torch"
    rounds: dict[str, list[tuple[float, float]]] = {column: [] for column in COLUMNS}
    with bench_session(0, "") as (_, _, _, shell):
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_cell_magic("distributed", job, "pass\n")  # starts the pool
            shell.run_cell_magic("distributed", session, START)  # starts the session
        for number in range(args.rounds):
            order = COLUMNS if number % 2 == 0 else COLUMNS[::-1]
            for column in order:
                if column == "warm job":
                    wait_for_pool(workers)
                    rounds[column].append(run(shell, job, "", workers))
                else:
                    rounds[column].append(run(shell, "--session bench", "", workers))
                dispatch, trip = rounds[column][-1]
                print(
                    f"round {number + 1} {column}: dispatch {dispatch * 1000:.1f} ms, "
                    f"round trip {trip * 1000:.1f} ms",
                    flush=True,
                )
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_line_magic("distributed", "stop " + _session_job_id())
    print(f"{args.rounds} rounds, {workers} ranks")
    for index, what in enumerate(("dispatch (to the last rank running)", "round trip")):
        print(f"median {what}:")
        for column in COLUMNS:
            median = statistics.median(r[index] for r in rounds[column])
            print(f"  {column:<9} {median * 1000:.1f} ms")
        ratios = [
            s[index] / j[index] for s, j in zip(rounds["session"], rounds["warm job"], strict=True)
        ]
        mean, low, high = mean_with_interval(ratios)
        print(f"  session / warm job: {mean:.3f}x (95% CI {low:.3f}-{high:.3f})")
    save_rounds("session_dispatch", args, {c: [list(r) for r in v] for c, v in rounds.items()})
    return 0


def _session_job_id() -> str:
    from jupyter_distrain.client import session

    job = session.find("bench")
    return job.id if job is not None else ""


if __name__ == "__main__":
    sys.exit(main())
