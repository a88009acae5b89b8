#!/usr/bin/env bash
# The GPU check, for a machine with NVIDIA GPUs (not CI: CI has none).
# Installs a GPU build of TensorFlow (2.15.1 where Python <= 3.11, the pinned version;
# else 2.20 with tf-keras), this package, then runs a job with one GPU per worker
# (2 workers, or 1 on a single-GPU machine) and prints each worker's device, images/sec
# and the GPU utilisation and memory the supervisor sampled.   usage: bash benchmarks/gpu_check.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/tmp/gpu-venv}
python3 -m venv "$venv"
py=$venv/bin/python
if $py -c 'import sys; sys.exit(sys.version_info[:2] > (3, 11))'; then
  tf='tensorflow[and-cuda]==2.15.1'
else
  tf='tensorflow[and-cuda]==2.20.0 tf-keras==2.20.1'
fi
$py -m pip install -q --upgrade pip
$py -m pip install -q $tf nvidia-ml-py -e .
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
PYTHONUNBUFFERED=1 JUPYTER_DISTRAIN_ROOT=$(mktemp -d) $py - <<'PY'
import json
from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.launchers import gpus

workers = min(2, len(gpus.discover()))
cell = """
import os, numpy as np, tensorflow as tf, jupyter_distrain
strategy = jupyter_distrain.strategy()
print("device", os.environ.get("CUDA_VISIBLE_DEVICES"), tf.config.list_physical_devices("GPU"), flush=True)
x = np.random.default_rng(0).random((8192, 64, 64, 3)).astype("float32")
y = np.random.default_rng(1).integers(0, 10, 8192)
with strategy.scope():
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=128 * strategy.num_replicas_in_sync, epochs=2, verbose=0)
"""
import time
job = submit(JobSpec(code=cell, workers=workers, backend="tf", gpus=1, timeout=600))
busiest = {}  # the GPU utilisation and memory the supervisor sampled (NVML), at their peak
while not job.done:
    for p in job.status().processes:
        if p.gpu_percent is not None:
            old = busiest.get(str(p.id), (0.0, 0))
            busiest[str(p.id)] = (max(old[0], p.gpu_percent), max(old[1], p.gpu_memory or 0))
    time.sleep(2)
print("job", job.id, "state", job.wait(timeout=1800))
for pid, (percent, memory) in sorted(busiest.items()):
    print(f"{pid}: GPU utilisation up to {percent:.0f}%, memory up to {memory / 2**30:.1f} GiB")
for p in job.status().processes:
    records = [json.loads(l) for l in job.dir.metrics_file.read_text().splitlines()]
    rates = [r["images_per_sec"] for r in records if ProcessId.of(r) == p.id and "images_per_sec" in r]
    tail = rates[len(rates) // 2:] or [0]
    print(f"{p.id}: gpus {p.gpus}, {sum(tail) / len(tail):,.0f} images/sec (second half)")
    print("  ", [l for l in job.logs(p.id).splitlines() if l.startswith("device")])
PY
