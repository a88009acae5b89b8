"""Scale latency: seconds from a scale request (2 -> 3 workers) to the first training step
at the new size, against a cold start of the same job with 3 workers (submit to first step).

Checkpoint-and-restart (a Keras ``fit`` job, resumed from its BackupAndRestore checkpoint)
and elastic Horovod (no restart) are both measured.

    .venv/bin/python benchmarks/scale_latency.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

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
    job = submit(JobSpec(code=code, workers=3, name="cold"))
    wait_until(
        lambda: job.dir.metrics_file.exists() and first_step_time(job, lambda r: True) is not None
    )
    first = first_step_time(job, lambda r: True)
    job.stop()
    return first - started


def scaled(code: str, at_new_size) -> float:
    job = submit(JobSpec(code=code, workers=2, name="scaled", grace=3))
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
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        keras = "EPOCHS = 200\n" + KERAS
        elastic = "STEPS = 100000\n" + ELASTIC
        rows = [
            (
                "checkpoint + restart (Keras fit)",
                scaled(keras, lambda r: ProcessId.of(r) == ProcessId("worker", 2)),
                cold_start(keras),
            ),
            ("elastic Horovod", scaled(elastic, lambda r: r.get("size") == 3), cold_start(elastic)),
        ]
    print(f"{'2 -> 3 workers':<34}{'scale (s)':>11}{'cold start (s)':>16}{'ratio':>8}")
    for name, scale_s, cold_s in rows:
        print(f"{name:<34}{scale_s:>11.2f}{cold_s:>16.2f}{scale_s / cold_s:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
