"""Metrics channel throughput: records/s the supervisor's collector stores from 4 senders,
and whether every record arrived.

Each sender is a separate process using the workers' own Reporter (batched,
signed); the collector is the supervisor's. Target: >= 50,000 records/s, no loss.

    .venv/bin/python benchmarks/metrics_channel.py [--senders 4] [--records 100000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from jupyter_distrain.contract.metrics import Collector, Reporter
from jupyter_distrain.contract.process import ProcessId

SECRET = "benchmark-secret"


def send(address: str, rank: int, records: int) -> None:
    reporter = Reporter(address, SECRET, ProcessId("worker", rank).fields())
    now = time.time()
    for step in range(records):
        reporter.report(
            {"step": step, "time": now, "images": 64, "images_per_sec": 1000.0, "loss": 0.5}
        )
    reporter.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--records", type=int, default=100_000, help="per sender")
    args = parser.parse_args()
    expected = args.senders * args.records
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        collector = Collector(SECRET, path, lambda record: None).start()
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=send, args=(collector.address, r, args.records))
            for r in range(args.senders)
        ]
        started = time.perf_counter()
        for p in procs:
            p.start()
        while collector.records < expected and time.perf_counter() - started < 120:
            if not any(p.is_alive() for p in procs) and collector.records < expected:
                time.sleep(0.5)  # the last batches in flight
                if collector.records < expected:
                    break
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        for p in procs:
            p.join()
        collector.stop()
        lines = path.read_bytes().splitlines()
        per_rank = [0] * args.senders
        for line in lines:
            per_rank[ProcessId.of(json.loads(line)).index] += 1
    print(
        f"senders {args.senders}, records sent {expected:,}, stored {len(lines):,} "
        f"(per sender: {per_rank}), rejected {collector.rejected}"
    )
    print(
        f"{len(lines) / elapsed:,.0f} records/s stored (target >= 50,000), "
        f"{'no loss' if len(lines) == expected else 'LOSS'}"
    )
    return 0 if len(lines) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
