"""The GPU check: one short job per framework this Python has (TensorFlow, PyTorch, JAX),
each worker on its own GPU (``--gpus 1``), printing each worker's device, its images/sec
(second half of the run), the GPU utilisation and memory the supervisor sampled (NVML),
and whether the ranks' weights agree. Exits 1 if a job fails or the weights differ.

Workers: min(2, the machine's GPUs). ``--cpu`` runs the same jobs with 2 workers and no
GPU, which is how the script is kept working where no GPU machine is lent (test_torch).
``benchmarks/gpu_check.sh`` sets up the GPU machine's Python and runs this.

    python benchmarks/gpu_check.py [--frameworks torch,jax,tf] [--steps 200] [--batch 64] [--cpu]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import dataclass

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.launchers import gpus

# Each cell trains on synthetic images (no data set download), then prints one line
# "weights <checksum of this rank's weights>"; every rank must print the same one.
TORCH_CELL = """
import torch, torch.nn as nn, torch.distributed as dist
import jupyter_distrain.torch as jdt
device = jdt.setup()
name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
print("device", device, name, dist.get_backend(), flush=True)
torch.manual_seed(0)
net = nn.Sequential(
    nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
).to(device)
model = nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn({batch} * 8, 3, 64, 64),
                                      torch.randint(0, 10, ({batch} * 8,)))
loader = torch.utils.data.DataLoader(data, batch_size={batch}, drop_last=True)
steps = 0
while steps < {steps}:
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        steps += 1
        if steps == {steps}:
            break
checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
print("weights", f"{{checksum.item():.9e}}", flush=True)
dist.destroy_process_group()
"""

JAX_CELL = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
import jupyter_distrain
jax.distributed.initialize()
print("device", jax.local_devices(), jax.process_count(), flush=True)
rng = np.random.default_rng(jax.process_index())
x = jnp.asarray(rng.random(({batch}, 3072), dtype=np.float32))
y = jnp.asarray(rng.integers(0, 10, {batch}))
params = [jax.random.normal(jax.random.PRNGKey(0), (3072, 1024)) * 0.01,
          jax.random.normal(jax.random.PRNGKey(1), (1024, 10)) * 0.01]
def loss(params, x, y):
    logits = jax.nn.relu(x @ params[0]) @ params[1]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])
grad = jax.jit(jax.value_and_grad(loss))
for step in range({steps}):
    with jupyter_distrain.timed_step(images={batch}) as s:
        value, g = grad(params, x, y)
        g = [m.mean(0) for m in multihost_utils.process_allgather(g)]  # the ranks' mean
        params = [p - 0.01 * d for p, d in zip(params, g)]
        s["loss"] = float(value)
print("weights", f"{{sum(float(jnp.sum(p)) for p in params):.9e}}", flush=True)
"""

TF_CELL = """
import numpy as np, tensorflow as tf, jupyter_distrain
strategy = jupyter_distrain.strategy()
print("device", tf.config.list_physical_devices("GPU"), flush=True)
x = np.random.default_rng(0).random(({batch} * 16, 64, 64, 3)).astype("float32")
y = np.random.default_rng(1).integers(0, 10, {batch} * 16)
with strategy.scope():
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
epochs = max(1, {steps} // 16)
model.fit(x, y, batch_size={batch} * strategy.num_replicas_in_sync, epochs=epochs, verbose=0)
print("weights", f"{{sum(float(np.sum(w)) for w in model.get_weights()):.9e}}", flush=True)
"""


@dataclass(frozen=True)
class Check:
    """One framework's job: the module it needs and the cell."""

    module: str
    cell: str


CHECKS = {  # by the backend each runs on
    "torch": Check("torch", TORCH_CELL),
    "jax": Check("jax", JAX_CELL),
    "tf": Check("tensorflow", TF_CELL),
}


def follow(job: Job) -> dict[str, tuple[float, int]]:
    """Wait for the job; the peak GPU utilisation and memory sampled for each process."""
    busiest: dict[str, tuple[float, int]] = {}
    while not job.done:
        for p in job.status().processes:
            if p.gpu_percent is not None:
                old = busiest.get(str(p.id), (0.0, 0))
                busiest[str(p.id)] = (max(old[0], p.gpu_percent), max(old[1], p.gpu_memory or 0))
        time.sleep(1)
    return busiest


def images_per_sec(records: list[dict], process: ProcessId) -> float:
    """The mean images/sec of the second half of a process's steps (``records``: the
    job's metrics)."""
    rates = [
        r["images_per_sec"]
        for r in records
        if ProcessId.of(r) == process and isinstance(r.get("images_per_sec"), (int, float))
    ]
    tail = rates[len(rates) // 2 :]
    return sum(tail) / len(tail) if tail else 0.0


def run_check(
    name: str, check: Check, workers: int, gpus_each: int, steps: int, batch: int
) -> bool:
    """Run one framework's job and print what it did; True if it passed."""
    code = check.cell.format(steps=steps, batch=batch)
    spec = JobSpec(code=code, workers=workers, backend=name, gpus=gpus_each, timeout=600)
    started = time.monotonic()
    job = submit(spec)
    busiest = follow(job)
    state = job.status()
    print(f"{name}: job {job.id} {state.state} in {time.monotonic() - started:.1f} s", end="")
    print(f" ({state.error})" if state.error else "")
    metrics = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    checksums = set()
    for p in state.processes:
        log = job.logs(p.id).splitlines()
        device = next((line for line in log if line.startswith("device")), "no device line")
        checksums |= {line.split()[1] for line in log if line.startswith("weights ")}
        percent, memory = busiest.get(str(p.id), (0.0, 0))
        print(
            f"  {p.id}: gpus {p.gpus or '-'}, {images_per_sec(metrics, p.id):,.0f} images/sec, "
            f"GPU up to {percent:.0f}% and {memory / 2**30:.1f} GiB; {device}"
        )
    agree = len(checksums) == 1
    print(f"  weights agree across {len(state.processes)} ranks: {agree} {sorted(checksums)}")
    return state.state == "succeeded" and agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default="torch,jax,tf", help="those not installed are said")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="per worker")
    parser.add_argument("--cpu", action="store_true", help="2 workers, no GPU")
    args = parser.parse_args()
    found = gpus.discover()
    workers, gpus_each = (2, 0) if args.cpu else (min(2, len(found)), 1)
    print(f"GPUs: {len(found)}; {workers} workers, {gpus_each} GPU each")
    if not workers:
        print("no GPU here (--cpu runs the same jobs on the CPU)")
        return 1
    passed = True
    for name in args.frameworks.split(","):
        check = CHECKS[name]
        if importlib.util.find_spec(check.module) is None:
            print(f"{name}: {check.module} is not installed: not checked")
            continue
        passed = run_check(name, check, workers, gpus_each, args.steps, args.batch) and passed
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
