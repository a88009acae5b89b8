"""``bench``: the parameter-server vs allreduce comparison, on this machine.

A synthetic image classifier (a small ResNet: a stem, residual blocks, global
pooling; image size, width, depth and batch size configurable) trains under each
backend for 1..N workers: horovod (ring allreduce), tf (MultiWorkerMirroredStrategy),
ps (ParameterServerStrategy, asynchronous: each step is one worker's batch) and ps-sync
(Cloudera's TF1 ``run(cluster, server, task_index)`` with ``SyncReplicasOptimizer``:
each global step averages one batch from every worker), the last two with each ``ps``
count. Each run is an ordinary job of this project (any launcher), whose reporting
process prints the job's images/sec over the epochs after the first (tracing and
connecting excluded). The result is a table of images/sec and scaling efficiency
(throughput at N / (N x throughput at 1)) per backend, a chart (SVG), and CSV and JSON
files in ``<jobs root>/bench/<time>/``.

``settings`` (what to measure) builds each run's cell from ``programs/`` (real Python
files, shipped as package data), ``runner`` runs them as jobs, ``report`` writes the
table, chart and files; ``flags`` are the flags of ``%distributed bench`` and
``jupyter-distrain bench``.

How bench runs
--------------

`%distributed bench` / `jupyter-distrain bench` run one ordinary job per
(backend, worker count, ps count) through `api.submit` (so any launcher), each a
small ResNet on synthetic images whose reporting process prints images/sec over
the epochs after the first; efficiency is throughput at N / (N x throughput at 1).
Results go to `<jobs root>/bench/<time>/` as CSV, JSON (with the settings) and an
SVG chart drawn by hand (no plotting dependency). Its launcher flags (`--launcher`,
`--hosts`, the ssh and Ray options) take their defaults from the config files, as the
cell's do. A run still going after `--timeout` is stopped, and a run that fails or
times out ends the bench with one line naming it and its job (`BenchFailed`; exit
status 1 from the command line), not a traceback. Parameter servers are measured
both ways: `ps` is ParameterServerStrategy (asynchronous), `ps-sync` the seed's TF1
`run(cluster, server, task_index)` contract with `SyncReplicasOptimizer`, whose chief
(worker 0) times global steps after the first epoch (each is one batch per worker).
"""

from .flags import add_arguments, settings_from
from .report import BenchRow, chart_svg, save, table
from .runner import BenchFailed, label, run, run_one
from .settings import BACKENDS, PS_BACKENDS, BenchSettings

__all__ = [
    "BACKENDS",
    "PS_BACKENDS",
    "BenchFailed",
    "BenchRow",
    "BenchSettings",
    "add_arguments",
    "chart_svg",
    "label",
    "run",
    "run_one",
    "save",
    "settings_from",
    "table",
]
