"""A fair share of its host's cores for each process of a job there.

TensorFlow sizes its intra- and inter-op thread pools to every core the process may
use, so k ranks on one host run k times as many busy threads as there are cores and
wait on each other's. Two Horovod Keras ranks on 2 cores train 1.21-1.25x faster with
one thread in each pool than with TensorFlow's default, 1.15x with one intra-op thread
alone (measured: ``horovodrun`` by hand with and without the variables below, 4-5
paired rounds of 800-1000 steps).

So where a job places several processes on a host (``Env.HOST_PROCESSES``, counted
from the plan by the supervisor), each gets ``cores // k`` threads (at least one)
through TensorFlow's own variables: the intra-op pool always, the inter-op pool only
for a program run as ``__main__`` (a TensorFlow server, or a TF1 program of
``run_cluster``, runs many blocking ops at once: queues, remote calls). Unless it has
either already: the user's ``--cpu`` (``launchers/limits.py`` sets them), ``--env`` or
the kernel's environment decide then, as does ``tf.config.threading`` in the program.
TensorFlow reads them when its runtime starts (the first op), not at import, so a
pooled process, which imported TensorFlow before its job existed, takes them as a cold
one does. ``OMP_NUM_THREADS`` is read when OpenMP is loaded, at import: the torch
backend sets it in the process's environment (as torchrun does), which a pool keys on.

Design decision
---------------

- **A share of the cores without `--cpu`** (`worker/threads.py`, 2026-12-04).
  TensorFlow sizes its intra- and inter-op pools to every core a process may use, so
  k ranks on one host run k times as many busy threads as there are cores. The
  supervisor counts the plan's processes per host (`JUPYTER_DISTRAIN_HOST_PROCESSES`,
  `supervisor/generation.py`; not mpirun's ranks, which mpirun binds to cores
  itself); each worker with k > 1 sets `TF_NUM_INTRAOP_THREADS` to `cores // k` (at
  least 1; cores = its affinity mask, so Slurm's or `--cpu`'s binding counts, or fewer
  where a cgroup's CPU quota allows fewer: `contract/box.py`), and
  `TF_NUM_INTEROP_THREADS` too for a program run as `__main__` (not a TensorFlow
  server or a TF1 `run_cluster` program, which run many blocking ops at once). Not
  where `--cpu`, `--env` or the kernel's environment set either: the user's choice
  wins, as does `tf.config.threading` in the program. TensorFlow reads them when
  its runtime starts (the first op), not at import, so a pooled process takes them
  as a cold one does (`test_pool` checks its runtime starts as many threads as a cold
  rank's). The torch backend sets `OMP_NUM_THREADS=1` as torchrun does (read when
  OpenMP loads, so it is part of a pool's environment). Measured, 2 Horovod Keras
  ranks on 2 cores, `horovodrun` by hand with and without the variables (4-5 paired
  rounds of 800-1000 steps): both pools at 1 thread 1.22x steps/sec (each rank
  pinned to a core instead: 1.21x), intra-op alone 1.15x. So `%%distributed` now
  trains faster than `horovodrun` by hand on a shared host (which does neither);
  `horovodrun` users get the same with these variables set.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from ..contract import box
from ..contract.process import Env, Mode

VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def share_cores(mode: str, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set TensorFlow's thread counts to this process's share of the cores it may use,
    for a worker in ``mode``; returns what was set (nothing for a host's only process,
    or a set choice)."""
    try:
        processes = int(environ.get(Env.HOST_PROCESSES, "1"))
    except ValueError:
        return {}
    if processes <= 1 or any(name in environ for name in VARIABLES):
        return {}
    threads = str(max(1, int(box.cpus().amount) // processes))
    shared = dict.fromkeys(VARIABLES if mode == Mode.TRAIN else VARIABLES[:1], threads)
    environ.update(shared)
    return shared
