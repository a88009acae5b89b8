"""Re-runs as a notebook makes them: three different 2-worker Horovod Keras cells run
back to back ("Run All"), then the last cell again straight away (a quick re-run), with
the pool on (the default). Each round starts after a pause that lets the pool refill,
so its first cell is a warm run after a pause and the other three follow a run with no
wait. The cells differ in their model (the width of the dense layer) and so are
different programs; each is launch_overhead.py's script for ``--steps`` steps.

Reported per position in the chain: the median and the slowest time from the cell's
start to rank 0's first finished training step, and how many of all the runs reached it
in under 1.0 s (issue 25's bound for every re-run); the pool's memory at the end. Raw
figures go to ``benchmarks/results/``.

    .venv/bin/python benchmarks/rerun_chain.py [--rounds 8] [--steps 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_overhead import (  # noqa: E402
    SCRIPT,
    bench_session,
    print_pool_memory,
    run_distributed,
    save_rounds,
    wait_for_pool,
)

WIDTHS = (64, 48, 96)  # one cell each: different programs, the same cost to start
BOUND = 1.0  # seconds from a cell's start to its first step


def cell(code: str, width: int) -> str:
    """The benchmark program with its dense layer ``width`` wide."""
    if "Dense(64," not in code:  # else every cell would be the same program, unnoticed
        raise RuntimeError("launch_overhead.SCRIPT no longer has the dense layer to widen")
    return code.replace("Dense(64,", f"Dense({width},")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()

    chain = [f"cell {i + 1}" for i in range(len(WIDTHS))] + ["cell 3 again"]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in chain}
    with bench_session(args.steps, SCRIPT) as (_, code, _, shell):
        cells = [cell(code, width) for width in WIDTHS]
        run_distributed(shell, cells[0])  # primes the pool and the standby
        for i in range(args.rounds):
            wait_for_pool()  # the pause before a round: its first cell is warm
            for name, program in zip(chain, [*cells, cells[-1]], strict=True):
                res = run_distributed(shell, program)
                results[name].append(res)
                print(f"round {i + 1} {name:<13} first step {res[0]:5.2f} s", flush=True)
        wait_for_pool()
        print_pool_memory()
        from jupyter_distrain.pool import client

        client.drain()

    print(f"\n{'cell':<14}{'median (s)':>12}{'slowest (s)':>13}")
    for name, runs in results.items():
        firsts = [first for first, _ in runs]
        print(f"{name:<14}{statistics.median(firsts):>12.2f}{max(firsts):>13.2f}")
    every = [first for runs in results.values() for first, _ in runs]
    under = sum(first < BOUND for first in every)
    print(f"{under} of {len(every)} runs reached their first step in under {BOUND:.1f} s")
    save_rounds("rerun_chain", args, results)
    return 0 if under == len(every) else 1


if __name__ == "__main__":
    sys.exit(main())
