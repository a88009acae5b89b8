"""``bench``: the seed's parameter-server vs allreduce comparison, on this machine.

A synthetic image classifier (a small ResNet: a stem, residual blocks, global
pooling; image size, width, depth and batch size configurable) trains under each
backend for 1..N workers: horovod (ring allreduce), tf (MultiWorkerMirroredStrategy),
ps (ParameterServerStrategy, asynchronous: each step is one worker's batch) and ps-sync
(the seed's TF1 ``run(cluster, server, task_index)`` with ``SyncReplicasOptimizer``:
each global step averages one batch from every worker), the last two with each ``ps``
count. Each run is an ordinary job of this
project (any launcher), whose reporting process prints the job's images/sec over the
epochs after the first (tracing and connecting excluded). The result is a table of
images/sec and scaling efficiency (throughput at N / (N x throughput at 1)) per
backend, a chart (SVG), and CSV and JSON files in ``<jobs root>/bench/<time>/``.

``%distributed bench`` and ``jupyter-distrain bench`` run it; the flags are
:func:`add_arguments`'.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import html
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.process import ProcessId
from ..contract.spec import JobSpec, SpecError
from .flags import add_launcher_arguments, launcher_options

BACKENDS = ("horovod", "tf", "ps", "ps-sync")
PS_BACKENDS = ("ps", "ps-sync")  # run with each --ps count

_PROGRAM = """\
import time
import numpy as np
import tensorflow as tf

IMAGE, WIDTH, BLOCKS = {image_size}, {width}, {blocks}
BATCH, STEPS, EPOCHS = {batch_size}, {steps}, {epochs}
x = np.random.default_rng(0).random((BATCH * 4, IMAGE, IMAGE, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 4)


def make_model():
    inputs = tf.keras.Input((IMAGE, IMAGE, 3))
    h = tf.keras.layers.Conv2D(WIDTH, 3, padding="same", activation="relu")(inputs)
    for _ in range(BLOCKS):
        r = tf.keras.layers.Conv2D(WIDTH, 3, padding="same", activation="relu")(h)
        r = tf.keras.layers.Conv2D(WIDTH, 3, padding="same")(r)
        h = tf.keras.layers.ReLU()(tf.keras.layers.Add()([h, r]))
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(h))


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

_BODIES = {
    "horovod": """
import horovod.tensorflow.keras as hvd
hvd.init()
model = make_model()
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss=LOSS)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)
model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0, callbacks=[
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    Clock(BATCH * hvd.size(), hvd.rank() == 0)])
""",
    "tf": """
import jupyter_distrain
strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)
global_batch = BATCH * strategy.num_replicas_in_sync
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0,
          callbacks=[Clock(global_batch, strategy.cluster_resolver.task_id == 0)])
""",
    "ps": """
import jupyter_distrain
strategy = jupyter_distrain.strategy()
with strategy.scope():
    model = make_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=LOSS)

def dataset_fn(input_context):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), steps_per_epoch=STEPS,
          epochs=EPOCHS, verbose=0, callbacks=[Clock(BATCH, True)])
""",
    "ps-sync": """
def run(cluster, server, task_index):  # the seed's contract: TF1 graph mode
    workers = cluster.num_tasks("worker")
    setter = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task_index}", cluster=cluster)
    with tf.compat.v1.device(setter):  # the variables on the ps, the compute here
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model = make_model()
        loss = LOSS(tf.constant(y[:BATCH]), model(tf.constant(x[:BATCH]), training=True))
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.01),
            replicas_to_aggregate=workers, total_num_replicas=workers)
        train_op = optimizer.minimize(loss, global_step, model.trainable_variables)
    chief = task_index == 0
    hooks = [optimizer.make_session_run_hook(chief),
             tf.compat.v1.train.StopAtStepHook(last_step=STEPS * EPOCHS)]
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task_index}"])
    first = None  # (global step, time) when the first epoch (the warm-up) is over
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=chief, hooks=hooks, config=config,
            stop_grace_period_secs=2) as session:
        while not session.should_stop():
            step = session.run([train_op, global_step])[1]
            if first is None and step >= STEPS:
                first = (step, time.perf_counter())
            last = (step, time.perf_counter())
    if chief:  # each global step is one batch from every worker
        rate = BATCH * workers * (last[0] - first[0]) / (last[1] - first[1])
        print(f"BENCH images_per_sec={rate:.1f}", flush=True)
""",
}
_REPORTER = {
    "horovod": ProcessId("worker", 0),
    "tf": ProcessId("worker", 0),
    "ps-sync": ProcessId("worker", 0),  # the seed's chief
}
_RATE = re.compile(r"BENCH images_per_sec=([\d.]+)")


@dataclass
class BenchSettings:
    """What to measure: worker counts 1..``workers``, the backends, the ps counts, the
    model and the launcher."""

    workers: int = 2
    backends: list[str] = field(default_factory=lambda: list(BACKENDS))
    ps: list[int] = field(default_factory=lambda: [1])
    image_size: int = 32
    width: int = 16
    blocks: int = 2
    batch_size: int = 32
    steps: int = 20
    epochs: int = 3
    launcher: str = "local"
    launcher_options: dict[str, Any] = field(default_factory=dict)  # hosts=, ray_address=...
    timeout: float = 600.0

    def validate(self) -> BenchSettings:
        """Raise :class:`SpecError` naming the first bad setting."""
        if self.workers < 1:
            raise SpecError(f"--workers must be >= 1, got {self.workers}")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise SpecError(
                f"--backends: {', '.join(unknown) or 'none given'}; choose from "
                f"{', '.join(BACKENDS)}"
            )
        if set(PS_BACKENDS) & set(self.backends) and (not self.ps or min(self.ps) < 1):
            raise SpecError(f"--ps needs counts >= 1, got {self.ps}")
        for name in ("image_size", "width", "blocks", "batch_size", "steps"):
            if getattr(self, name) < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be >= 1")
        if self.epochs < 2:
            raise SpecError("--epochs must be >= 2 (the first one warms up)")
        return self

    def program(self, backend: str) -> str:
        """The cell a run of ``backend`` executes."""
        return _PROGRAM.format(**dataclasses.asdict(self)) + _BODIES[backend]

    def runs(self) -> list[tuple[str, int, int]]:
        """(backend, workers, ps) for every run, one worker count at a time."""
        runs = []
        for n in range(1, self.workers + 1):
            for backend in self.backends:
                for ps in self.ps if backend in PS_BACKENDS else [0]:
                    runs.append((backend, n, ps))
        return runs


@dataclass
class BenchRow:
    """One run: its configuration, throughput and scaling efficiency."""

    backend: str  # "horovod", "tf", "ps async (1 ps)", "ps sync (1 ps)"
    workers: int
    images_per_sec: float
    efficiency: float | None  # throughput at N / (N x throughput at 1)
    job: str


def label(backend: str, ps: int) -> str:
    """The backend as the table names it."""
    if backend in PS_BACKENDS:
        return f"ps {'sync' if backend == 'ps-sync' else 'async'} ({ps} ps)"
    return backend


def run_one(settings: BenchSettings, backend: str, workers: int, ps: int) -> tuple[float, str]:
    """Run one configuration as a job; its images/sec and the job id."""
    from .api import submit

    spec = JobSpec(
        code=settings.program(backend),
        workers=workers,
        ps=ps,
        backend="ps" if backend in PS_BACKENDS else backend,
        launcher=settings.launcher,
        name="bench",
        **settings.launcher_options,
    )
    job = submit(spec)
    state = job.wait(timeout=settings.timeout)
    reporter = _REPORTER.get(backend, ProcessId("chief", 0))
    match = _RATE.search(job.logs(reporter))
    if state != "succeeded" or match is None:
        raise RuntimeError(f"bench run {label(backend, ps)} x{workers} ({job.id}) {state}")
    return float(match.group(1)), job.id


def run(
    settings: BenchSettings, progress: Callable[[str], None] = print
) -> tuple[list[BenchRow], Path]:
    """Run every configuration; returns the rows and the directory holding
    ``results.csv``, ``results.json`` and ``chart.svg``."""
    from ..contract.store import jobs_root

    settings.validate()
    runs = settings.runs()
    rates: dict[tuple[str, int], tuple[float, str]] = {}
    for i, (backend, workers, ps) in enumerate(runs, 1):
        name = label(backend, ps)
        progress(f"bench {i}/{len(runs)}: {name}, {workers} worker(s) ...")
        rates[(name, workers)] = run_one(settings, backend, workers, ps)
        rate = rates[(name, workers)][0]
        progress(f"bench {i}/{len(runs)}: {name}, {workers} worker(s): {rate:,.0f} images/sec")
    rows = []
    for (name, workers), (rate, job) in rates.items():
        single = rates.get((name, 1))
        efficiency = rate / (workers * single[0]) if single and single[0] else None
        rows.append(BenchRow(name, workers, rate, efficiency, job))
    out = jobs_root(create=True) / "bench" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, mode=0o700)
    save(rows, settings, out)
    return rows, out


def save(rows: list[BenchRow], settings: BenchSettings, out: Path) -> None:
    """``results.csv``, ``results.json`` (with the settings) and ``chart.svg``."""
    fields = [f.name for f in dataclasses.fields(BenchRow)]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)
    document = {
        "settings": dataclasses.asdict(settings),
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    (out / "results.json").write_text(json.dumps(document, indent=1))
    (out / "chart.svg").write_text(chart_svg(rows))


def table(rows: list[BenchRow]) -> str:
    """The results as a text table, one line per backend and worker count."""
    lines = [f"{'backend':<18}{'workers':>8}{'images/sec':>13}{'efficiency':>12}"]
    for r in sorted(rows, key=lambda r: (r.backend, r.workers)):
        efficiency = "-" if r.efficiency is None else f"{r.efficiency:.2f}"
        lines.append(f"{r.backend:<18}{r.workers:>8}{r.images_per_sec:>13,.0f}{efficiency:>12}")
    return "\n".join(lines)


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def chart_svg(rows: list[BenchRow], width: int = 480, height: int = 280) -> str:
    """Images/sec against workers, one line per backend, as a standalone SVG."""
    left, bottom, top, right = 60, 40, 20, 120
    top_rate = max((r.images_per_sec for r in rows), default=1.0) or 1.0
    most = max((r.workers for r in rows), default=1)

    def point(r: BenchRow) -> str:
        x = left + (r.workers - 1) / max(1, most - 1) * (width - left - right)
        y = height - bottom - r.images_per_sec / top_rate * (height - top - bottom)
        return f"{x:.1f},{y:.1f}"

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='sans-serif' font-size='11'>",
        f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' "
        "stroke='#444'/>",
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#444'/>",
        f"<text x='{left}' y='{height - 8}'>workers (1..{most})</text>",
        f"<text x='4' y='{top + 4}'>{top_rate:,.0f}</text>",
        f"<text x='4' y='{height - bottom}'>0</text>",
        f"<text x='4' y='{top + 18}'>img/s</text>",
    ]
    names = sorted({r.backend for r in rows})
    for i, name in enumerate(names):
        colour = _COLOURS[i % len(_COLOURS)]
        line = sorted((r for r in rows if r.backend == name), key=lambda r: r.workers)
        points = " ".join(point(r) for r in line)
        parts.append(
            f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{points}'/>"
        )
        parts += [
            f"<circle cx='{point(r).split(',')[0]}' cy='{point(r).split(',')[1]}' r='3' "
            f"fill='{colour}'/>"
            for r in line
        ]
        parts.append(
            f"<text x='{width - right + 8}' y='{top + 14 * (i + 1)}' fill='{colour}'>"
            f"{html.escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def add_arguments(parser: Any) -> None:
    """The bench flags, shared by the magic and the command line."""
    parser.add_argument("--workers", type=int, default=2, help="worker counts 1..N (default 2)")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: horovod, tf, ps (async), ps-sync",
    )
    parser.add_argument(
        "--ps", default="1", help="parameter-server counts for ps and ps-sync, comma-separated"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16, help="filters per convolution")
    parser.add_argument("--blocks", type=int, default=2, help="residual blocks")
    parser.add_argument("--batch-size", type=int, default=32, help="images per worker step")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (the first warms up)")
    parser.add_argument("--launcher", default="local", help="local, ssh or ray")
    add_launcher_arguments(parser)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")


def settings_from(args: argparse.Namespace) -> BenchSettings:
    """Settings from parsed :func:`add_arguments` flags; a bad list is a SpecError."""
    try:
        ps = [int(p) for p in str(args.ps).split(",") if p.strip()]
    except ValueError:
        raise SpecError(f"--ps must be comma-separated whole numbers, got {args.ps!r}") from None
    # the flags are named after the settings (--batch-size -> batch_size)
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(BenchSettings)
        if f.name != "launcher_options"
    }
    given["launcher_options"] = launcher_options(args)
    given["backends"] = [b.strip() for b in str(args.backends).split(",") if b.strip()]
    given["ps"] = ps
    return BenchSettings(**given).validate()
