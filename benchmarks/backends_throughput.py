"""Images/sec of one synthetic Keras model under each way of synchronising replicas
(one fixed worker count; ``jupyter-distrain bench`` sweeps 1..N).

Backends, each with 2 workers, side by side in one run (rounds alternate the
order): horovod (ring allreduce over Gloo), ps with 1 and with 2 parameter
servers (ParameterServerStrategy: asynchronous, each step is one worker's batch),
ps-sync with 1 ps (the seed's TF1 program with SyncReplicasOptimizer), and tf
(MultiWorkerMirroredStrategy: collective allreduce over gRPC). The
figure is the job's aggregate images/sec after a warm-up epoch.

    .venv/bin/python benchmarks/backends_throughput.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from jupyter_distrain.client import bench

# the product's bench model (a small ResNet), 2 workers, a warm-up epoch then 3 timed
SETTINGS = bench.BenchSettings(workers=2, blocks=1, batch_size=64, steps=40, epochs=4)
CONFIGS = {
    "horovod": ("horovod", 0),
    "ps async (1 ps)": ("ps", 1),
    "ps async (2 ps)": ("ps", 2),
    "ps sync (1 ps)": ("ps-sync", 1),
    "tf": ("tf", 0),
}


def run_config(name: str) -> float:
    backend, ps = CONFIGS[name]
    return bench.run_one(SETTINGS, backend, 2, ps)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        results: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for i in range(args.rounds):
            order = list(CONFIGS) if i % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                results[name].append(run_config(name))
                print(f"round {i + 1} {name:<16} {results[name][-1]:8.1f} images/sec", flush=True)
    base = statistics.median(results["horovod"])
    print()
    print(f"{'backend (2 workers)':<22}{'images/sec':>12}{'vs horovod':>12}")
    for name, rates in results.items():
        rate = statistics.median(rates)
        print(f"{name:<22}{rate:>12.1f}{rate / base:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
