"""Scale latency: seconds from a scale request (2 -> 3 workers) to the first training step
at the new size, against a cold start of the same job with 3 workers (submit to first step).

Checkpoint-and-restart (a Keras ``fit`` job, resumed from its BackupAndRestore checkpoint)
is measured cold (``pool=False``) and from the warm pool (the scale asks the pool for the
new size while the ranks checkpoint; the pool primed by one run before); elastic Horovod
(no restart) too. The cold start is always ``pool=False``. Each of ``--rounds`` rounds
measures every row and a cold start; reported: medians and the mean of the per-round
ratios scale/cold start with a 95% confidence interval.

    .venv/bin/python benchmarks/scale_latency.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_overhead import mean_with_interval  # noqa: E402

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.timing import poll_until

KERAS = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
x = np.random.default_rng(0).random((64 * 20, 32), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, 64 * 20)
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=EPOCHS, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

ELASTIC = """
import time
import tensorflow as tf
import horovod.tensorflow as hvd
import jupyter_distrain
hvd.init()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
state = hvd.elastic.TensorFlowKerasState(model, tf.keras.optimizers.legacy.SGD(0.01), step=0)

@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
        jupyter_distrain.report(step=state.step, images=1, size=hvd.size())
        state.step += 1
        time.sleep(0.02)
        state.commit()

train(state)
"""


def first_step_time(job, predicate) -> float | None:
    for line in job.dir.metrics_file.read_text().splitlines():
        record = json.loads(line)
        if "step" in record and predicate(record):
            return record["time"]
    return None


def wait_until(predicate, timeout: float = 300) -> None:
    if not poll_until(predicate, timeout, 0.05):
        raise TimeoutError


def cold_start(code: str) -> float:
    started = time.time()
    job = submit(JobSpec(code=code, workers=3, name="cold", pool=False))
    wait_until(
        lambda: job.dir.metrics_file.exists() and first_step_time(job, lambda r: True) is not None
    )
    first = first_step_time(job, lambda r: True)
    job.stop()
    return first - started


def scaled(code: str, at_new_size, pool: bool = False) -> float:
    job = submit(JobSpec(code=code, workers=2, name="scaled", grace=3, pool=pool))
    wait_until(
        lambda: (
            job.dir.metrics_file.exists()
            and first_step_time(job, lambda r: r["step"] > 30) is not None
        )
    )
    requested = time.time()
    job.scale(3)
    wait_until(
        lambda: first_step_time(job, lambda r: r["time"] > requested and at_new_size(r)) is not None
    )
    first = first_step_time(job, lambda r: r["time"] > requested and at_new_size(r))
    job.stop()
    return first - requested


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        os.environ["JUPYTER_DISTRAIN_POOL"] = "1"
        keras = "EPOCHS = 200\n" + KERAS
        elastic = "STEPS = 100000\n" + ELASTIC
        third = lambda r: ProcessId.of(r) == ProcessId("worker", 2)  # noqa: E731
        rows = {
            "checkpoint + restart, cold": lambda: scaled(keras, third),
            "checkpoint + restart, pooled": lambda: scaled(keras, third, pool=True),
            "elastic Horovod": lambda: scaled(elastic, lambda r: r.get("size") == 3),
        }
        submit(JobSpec(code="EPOCHS = 1\n" + KERAS, workers=3, name="prime")).wait()
        measured: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        for i in range(args.rounds):
            cold = cold_start(keras)
            for name, run in rows.items():
                measured[name].append((run(), cold))
                print(f"round {i + 1} {name:<30} {measured[name][-1][0]:6.2f} s "
                      f"(cold start {cold:.2f} s)", flush=True)  # fmt: skip
        from jupyter_distrain.pool import client

        client.drain()
    print(f"{'2 -> 3 workers':<32}{'scale (s)':>11}{'cold start (s)':>16}{'ratio (95% CI)':>24}")
    for name, pairs in measured.items():
        mean, low, high = mean_with_interval([a / b for a, b in pairs])
        scale_s = statistics.median(a for a, _ in pairs)
        cold_s = statistics.median(b for _, b in pairs)
        print(f"{name:<32}{scale_s:>11.2f}{cold_s:>16.2f}   {mean:.2f} ({low:.2f}-{high:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
