#!/usr/bin/env bash
# The GPU check (not CI: CI has no GPU): benchmarks/gpu_check.py's jobs, one per framework
# the GPU machine's Python has (PyTorch on NCCL, JAX, TensorFlow), each worker on its own GPU.
#
#   bash benchmarks/gpu_check.sh wheels     here, with a network: .whl/ gets this package's
#                                           wheel and what a bare Python 3.12 lacks to run a
#                                           job (IPython, pyzmq, jupyter_core ...)
#   bash benchmarks/gpu_check.sh [ARGS]     on a GPU machine whose python3 has torch/JAX and
#                                           no network (the device machine: carry .whl):
#                                           installs .whl/ into /tmp/gpu-site, runs the check
#   bash benchmarks/gpu_check.sh venv [ARGS]  on a GPU machine with a network: a venv with
#                                           TensorFlow (GPU build), PyTorch and this package
#
# ARGS go to gpu_check.py (--frameworks, --steps, --batch). Set GPU_PYTHON for another Python.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
[[ $mode == wheels || $mode == venv ]] && shift || true
py=${GPU_PYTHON:-python3}
case $mode in
  wheels)
    rm -rf .whl && mkdir .whl
    .venv/bin/pip wheel -q --no-deps -w .whl .
    # the device machine's Python 3.12 (/work/.library/device/KINDS.md lists what it has)
    .venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl ipython pyzmq jupyter_core cloudpickle psutil
    du -sh .whl
    exit 0
    ;;
  venv)
    venv=/tmp/gpu-venv
    python3 -m venv "$venv"
    py=$venv/bin/python
    if $py -c 'import sys; sys.exit(sys.version_info[:2] > (3, 11))'; then
      tf='tensorflow[and-cuda]==2.15.1'
    else
      tf='tensorflow[and-cuda]==2.20.0 tf-keras==2.20.1'
    fi
    $py -m pip install -q --upgrade pip
    $py -m pip install -q $tf torch nvidia-ml-py -e .
    ;;
  *)
    if [[ -d .whl ]]; then
      $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-site .whl/*.whl
      export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    ;;
esac
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
JUPYTER_DISTRAIN_ROOT=$(mktemp -d) PYTHONUNBUFFERED=1 exec "$py" benchmarks/gpu_check.py "$@"
