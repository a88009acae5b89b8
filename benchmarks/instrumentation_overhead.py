"""Instrumentation overhead: Keras steps/sec with the automatic metrics (and the injected
BackupAndRestore) against the same job with them switched off
(``JUPYTER_DISTRAIN_INSTRUMENT=0``), alternated, 2 Horovod workers. Target: ratio >= 0.99.

    .venv/bin/python benchmarks/instrumentation_overhead.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract.process import ProcessId

SCRIPT = """
import time
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
x = np.random.default_rng(0).random((64 * 16, 32), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, 64 * 16)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Clock(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        steps = self.params["steps"] * (self.params["epochs"] - 1)
        rate = steps / (time.perf_counter() - self.start)
        if hvd.rank() == 0:
            print(f"BENCH steps_per_sec={rate:.2f}", flush=True)


model.fit(data, steps_per_epoch=500, epochs=4, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Clock()])
"""


def run(instrumented: bool) -> float:
    env = {} if instrumented else {"JUPYTER_DISTRAIN_INSTRUMENT": "0"}
    job = submit(JobSpec(code=SCRIPT, workers=2, env=env, name="overhead"))
    job.wait()
    log = job.logs(ProcessId("worker", 0))
    return float(re.search(r"BENCH steps_per_sec=([\d.]+)", log).group(1))


def direct_cost_per_step(steps: int = 50_000) -> float:
    """Seconds the Keras metrics callback adds to one step, timed on its own, with a real
    reporter sending to a real collector (what the end-to-end ratio cannot resolve on a
    noisy 2-core machine)."""
    import keras

    from jupyter_distrain.contract.control import ControlInfo
    from jupyter_distrain.contract.metrics import Collector
    from jupyter_distrain.contract.process import Env
    from jupyter_distrain.contract.store import JobDir
    from jupyter_distrain.worker import keras_hook

    with tempfile.TemporaryDirectory() as tmp:
        collector = Collector("secret", Path(tmp) / "metrics.jsonl", lambda record: None).start()
        JobDir(tmp).write_control(ControlInfo("unix:/nowhere", collector.address, "secret", 0))
        os.environ.update(
            {Env.METRICS: collector.address, Env.JOB_DIR: tmp, Env.CONTROL: "unix:/nowhere"}
        )
        callback = keras_hook.make_callbacks(keras, 64)[0]
        callback.params = {"steps": steps, "epochs": 1}
        callback.on_train_begin()
        logs = {"loss": 0.5}
        start = time.perf_counter()
        for step in range(steps):
            callback.on_train_batch_begin(step, logs)
            callback.on_train_batch_end(step, logs)
        elapsed = time.perf_counter() - start
        collector.stop()
    return elapsed / steps


def direct_cost_per_torch_step(steps: int = 50_000) -> float:
    """Seconds the torch hooks add to one step (the optimizer step hook and the
    DataLoader's batch size), timed on their own with a real reporter and collector."""
    import torch

    from jupyter_distrain.contract.control import ControlInfo
    from jupyter_distrain.contract.metrics import Collector
    from jupyter_distrain.contract.process import Env
    from jupyter_distrain.contract.store import JobDir
    from jupyter_distrain.worker import torch_hook

    with tempfile.TemporaryDirectory() as tmp:
        collector = Collector("secret", Path(tmp) / "metrics.jsonl", lambda record: None).start()
        JobDir(tmp).write_control(ControlInfo("unix:/nowhere", collector.address, "secret", 0))
        os.environ.update(
            {Env.METRICS: collector.address, Env.JOB_DIR: tmp, Env.CONTROL: "unix:/nowhere"}
        )
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        batch = (torch.zeros(64, 8), torch.zeros(64))
        start = time.perf_counter()
        for _ in range(steps):
            torch_hook._state["images"] = torch_hook.batch_size(batch)
            torch_hook._after_step(optimizer, (), {})
        elapsed = time.perf_counter() - start
        collector.stop()
    return elapsed / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--direct-only", action="store_true", help="only time the callback on its own"
    )
    args = parser.parse_args()
    if args.direct_only:
        print(f"the Keras metrics callback: {direct_cost_per_step() * 1e6:.1f} us per step")
        torch_cost = direct_cost_per_torch_step()
        print(f"the torch hooks: {torch_cost * 1e6:.1f} us per step")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        rates: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.rounds):
            for instrumented in (True, False) if i % 2 == 0 else (False, True):
                rates[instrumented].append(run(instrumented))
                print(
                    f"round {i + 1} {'with' if instrumented else 'without':<8} "
                    f"{rates[instrumented][-1]:7.1f} steps/s",
                    flush=True,
                )
    paired = [a / b for a, b in zip(rates[True], rates[False], strict=True)]
    print(
        f"\nmedian steps/sec: with {statistics.median(rates[True]):.1f}, "
        f"without {statistics.median(rates[False]):.1f}"
    )
    print(
        f"ratio with/without: median of medians "
        f"{statistics.median(rates[True]) / statistics.median(rates[False]):.3f}, "
        f"median of per-round ratios {statistics.median(paired):.3f} (target >= 0.99)"
    )
    cost = direct_cost_per_step()
    print(
        f"the metrics callback alone: {cost * 1e6:.1f} us per step = "
        f"{cost * 200:.2%} of a step at 200 steps/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
