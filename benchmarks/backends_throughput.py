"""Images/sec of one synthetic Keras model under each way of synchronising replicas.

Backends, each with 2 workers, side by side in one run (rounds alternate the
order): horovod (ring allreduce over Gloo), ps with 1 and with 2 parameter
servers (ParameterServerStrategy: asynchronous, each step is one worker's batch),
and tf (MultiWorkerMirroredStrategy: collective allreduce over gRPC). The
figure is the job's aggregate images/sec after a warm-up epoch.

    .venv/bin/python benchmarks/backends_throughput.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract import ProcessId

BATCH, STEPS, EPOCHS = 64, 40, 4

COMMON = f"""
import time
import numpy as np
import tensorflow as tf

BATCH, STEPS, EPOCHS = {BATCH}, {STEPS}, {EPOCHS}
x = np.random.default_rng(0).random((BATCH * 4, 32, 32, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 4)


def make_model():
    return tf.keras.Sequential([
        tf.keras.Input((32, 32, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Clock(tf.keras.callbacks.Callback):
    def __init__(self, images_per_step, report):
        super().__init__()
        self.images_per_step, self.report = images_per_step, report

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:  # the first epoch warms up (tracing, connections)
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        rate = self.images_per_step * STEPS * (EPOCHS - 1) / (time.perf_counter() - self.start)
        if self.report:
            print(f"BENCH images_per_sec={{rate:.1f}}", flush=True)
"""

HOROVOD = """
import horovod.tensorflow.keras as hvd
hvd.init()
model = make_model()
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=LOSS)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)
model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0, callbacks=[
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    Clock(BATCH * hvd.size(), hvd.rank() == 0)])
"""

TF_COLLECTIVE = """
import jupyter_distrain
strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)
global_batch = BATCH * strategy.num_replicas_in_sync
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
is_chief = strategy.cluster_resolver.task_id == 0
model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0,
          callbacks=[Clock(global_batch, is_chief)])
"""

PARAMETER_SERVERS = """
import jupyter_distrain
strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)

def dataset_fn(input_context):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), steps_per_epoch=STEPS,
          epochs=EPOCHS, verbose=0, callbacks=[Clock(BATCH, True)])
"""

CONFIGS = {
    "horovod": (dict(backend="horovod"), HOROVOD, "worker"),
    "ps (1 ps)": (dict(backend="ps", ps=1), PARAMETER_SERVERS, "chief"),
    "ps (2 ps)": (dict(backend="ps", ps=2), PARAMETER_SERVERS, "chief"),
    "tf": (dict(backend="tf"), TF_COLLECTIVE, "worker"),
}


def run_config(name: str) -> float:
    fields, body, reporter = CONFIGS[name]
    job = submit(JobSpec(code=COMMON + body, workers=2, name="bench", **fields))
    job.wait()
    match = re.search(r"BENCH images_per_sec=([\d.]+)", job.logs(ProcessId(reporter, 0)))
    if match is None:
        raise RuntimeError(f"{name}: no BENCH line in {job.id}")
    return float(match.group(1))


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
                print(f"round {i + 1} {name:<10} {results[name][-1]:8.1f} images/sec", flush=True)
    base = statistics.median(results["horovod"])
    print()
    print(f"{'backend (2 workers)':<22}{'images/sec':>12}{'vs horovod':>12}")
    for name, rates in results.items():
        rate = statistics.median(rates)
        print(f"{name:<22}{rate:>12.1f}{rate / base:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
