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
