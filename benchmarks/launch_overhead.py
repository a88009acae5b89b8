"""Launch overhead: plain ``horovodrun --gloo -np 2`` against ``%%distributed --workers 2``,
started cold (``--no-pool``) and warm (processes taken from the warm pool); with
``--framework torch``, ``torchrun --standalone --nproc-per-node 2`` against
``%%distributed --backend torch`` the same way (a small DDP model over Gloo), and the
two ranks started with torchrun's variables and no launcher at all (``floor``: what no
cold launcher can beat, since every rank imports torch itself); with
``--framework jax``, the same Keras 3 model on JAX (``keras.distribution.DataParallel``)
started by hand, two processes each given its ``keras.distribution.initialize``
arguments (coordinator, process count, process id), against ``--backend jax``.

The same Keras script runs ``--rounds`` times under each column: the launcher by hand;
``distributed`` (cold, ``--no-pool``); ``warm`` (the pool ready); ``back to back`` (warm,
started straight after ``warm`` ended, as "Run All" or a quick re-run does: no wait for
the pool); ``refill at end`` (warm, with the pool refilled when the job ends rather
than one run ahead at claim time, ``JUPYTER_DISTRAIN_POOL_AHEAD=0``: what the refill
beside a job costs it); ``no standby`` (warm, with the kernel's supervisor on standby
ended first: the supervisor starts cold, what the standby saves); with ``--framework
jax`` also ``no compile cache`` (warm, with an empty compilation cache each run, as
before ``worker/compile_cache.py``: what it saves a re-run). Every cell is
followed to its end, as a notebook's is. The order of the units rotates each round so
each comes first
equally often. Rank 0 prints the wall-clock time of its first finished training step
and its steps/sec after a warm-up. The benchmark reports the medians, and the mean of
the per-round ratios (the runs of a round ran back to back, so pairing cancels the
machine's drifts) with a 95% confidence interval: time-to-first-step (lower is
better; warm: under 1.0 s) and steps/sec (higher is better, target >= 0.99: the
interval must reach 0.99), against the launcher by hand, warm against cold, and warm
against refill-at-end. A single pair swings about +-5% on 2 cores: 20 rounds are
needed to see 1%. After each pooled unit the pool is left to finish refilling, so no
other run shares the cores with a pool's imports. The raw per-round figures are saved
to ``benchmarks/results/``.

    .venv/bin/python benchmarks/launch_overhead.py [--rounds 20] [--steps 600] [--framework torch]
    .venv-current/bin/python benchmarks/launch_overhead.py --framework jax
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def keras_clock(keras: str, rank: str) -> str:
    """A Keras callback class ``Clock``: rank 0 prints the BENCH line at the end."""
    return f"""
class Clock({keras}.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.first = time.time()
        if batch == WARMUP:
            self.warm = time.perf_counter()

    def on_train_end(self, logs=None):
        rate = (STEPS - 1 - WARMUP) / (time.perf_counter() - self.warm)
        if {rank} == 0:
            print(f"BENCH first_step={{{{self.first:.6f}}}} "
                  f"steps_per_sec={{{{rate:.3f}}}}", flush=True)
"""


SCRIPT = (
    """\
import time
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
STEPS, WARMUP, BATCH = {steps}, 20, 64
x = np.random.default_rng(hvd.rank()).random((BATCH * 8, 32, 32, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 8)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
model = tf.keras.Sequential([
    tf.keras.Input((32, 32, 3)),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


"""
    + keras_clock("tf.keras", "hvd.rank()")
    + """

model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Clock()])
"""
)

TORCH_SCRIPT = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
STEPS, WARMUP, BATCH = {steps}, 20, 64
torch.manual_seed(dist.get_rank())
x = torch.rand(BATCH * 8, 3, 32, 32)
y = torch.randint(0, 10, (BATCH * 8,))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
    torch.nn.Linear(16 * 15 * 15, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_of = torch.nn.CrossEntropyLoss()
for step in range(STEPS):
    batch = slice((step % 8) * BATCH, (step % 8 + 1) * BATCH)
    optimizer.zero_grad()
    loss_of(model(x[batch]), y[batch]).backward()
    optimizer.step()
    if step == 0:
        first = time.time()
    if step == WARMUP:
        warm = time.perf_counter()
rate = (STEPS - 1 - WARMUP) / (time.perf_counter() - warm)
if dist.get_rank() == 0:
    print(f"BENCH first_step={{first:.6f}} steps_per_sec={{rate:.3f}}", flush=True)
dist.destroy_process_group()
"""

JAX_SCRIPT = (
    """\
import os, time
os.environ.setdefault("KERAS_BACKEND", "jax")
import jax
import keras
import numpy as np

keras.distribution.initialize()
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
STEPS, WARMUP, BATCH = {steps}, 20, 64
x = np.random.default_rng(jax.process_index()).random((BATCH * 8, 32, 32, 3), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, BATCH * 8)
model = keras.Sequential([
    keras.Input((32, 32, 3)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
model.compile(optimizer=keras.optimizers.SGD(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


"""
    + keras_clock("keras", "jax.process_index()")
    + """

repeats = -(-STEPS // 8)
model.fit(np.concatenate([x] * repeats)[: STEPS * BATCH],
          np.concatenate([y] * repeats)[: STEPS * BATCH],
          batch_size=BATCH, epochs=1, verbose=0, callbacks=[Clock()])
"""
)

BENCH_RE = re.compile(r"BENCH first_step=([\d.]+) steps_per_sec=([\d.]+)")


def parse(text: str) -> tuple[float, float]:
    match = BENCH_RE.search(text)
    if match is None:
        raise RuntimeError(f"no BENCH line in output:\n{text[-3000:]}")
    return float(match.group(1)), float(match.group(2))


def run_by_hand(argv: list[str]) -> tuple[float, float]:
    """A launcher run by hand: what it printed stands even if it exits non-zero after
    that (torch's Gloo teardown sometimes aborts a rank at exit, once it has printed)."""
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        print(f"  ({Path(argv[0]).name} exited {proc.returncode}: {proc.stderr.strip()[-300:]!r})")
    first, rate = parse(proc.stdout)
    return first - started, rate


def run_horovodrun(script: Path) -> tuple[float, float]:
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    return run_by_hand(
        [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, str(script)]
    )


def run_torchrun(script: Path) -> tuple[float, float]:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return run_by_hand([torchrun, "--standalone", "--nproc-per-node", "2", str(script)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_two_processes(
    script: Path, env_of_rank: Callable[[int], dict[str, str]]
) -> tuple[float, float]:
    """Two processes of ``script`` started directly, each with ``env_of_rank(rank)``."""
    started = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env_of_rank(rank)},
        )
        for rank in (0, 1)
    ]
    outputs = [proc.communicate() for proc in procs]
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode:  # said, not fatal: rank 0's figures stand if it printed them
            print(f"  (by hand, rank {rank} exited {proc.returncode}: {err.strip()[-300:]!r})")
    first, rate = parse(outputs[0][0])
    return first - started, rate


def run_jax_by_hand(script: Path) -> tuple[float, float]:
    """Each process given its ``keras.distribution.initialize`` arguments (which Keras
    passes to ``jax.distributed.initialize``) as Keras reads them from the environment."""
    coordinator = f"127.0.0.1:{free_port()}"
    return run_two_processes(
        script,
        lambda rank: {
            "KERAS_BACKEND": "jax",
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
        },
    )


def run_torch_floor(script: Path) -> tuple[float, float]:
    """The two ranks started directly with the variables torchrun gives them and no
    launcher at all: what no cold launcher can beat (each rank imports torch)."""
    port = str(free_port())
    return run_two_processes(
        script,
        lambda rank: {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
            "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        },
    )  # fmt: skip


# per framework: the program, the launcher by hand it is compared with, that one's runner
FRAMEWORKS = {
    "keras": (SCRIPT, "horovodrun", run_horovodrun),
    "torch": (TORCH_SCRIPT, "torchrun", run_torchrun),
    "jax": (JAX_SCRIPT, "by hand", run_jax_by_hand),
}
# where the launcher by hand has a cost of its own: the processes started with no launcher
FLOORS = {"torch": run_torch_floor}


def wait_for_pool(processes: int = 2, timeout: float = 120.0) -> None:
    """Until the pool has ``processes`` idle processes ready (a refill has finished)."""
    from jupyter_distrain.pool import client

    deadline = time.time() + timeout
    while time.time() < deadline:
        pools = client.list_pools()
        if pools and len(pools[0].idle) >= processes and not pools[0].starting:
            return
        time.sleep(0.2)
    raise RuntimeError("the warm pool did not fill")


def run_distributed(
    shell, code: str, flags: str = "", ran: list | None = None
) -> tuple[float, float]:
    """One ``%%distributed --workers 2`` run of ``code``: rank 0's time to its first step
    and its steps/sec; the job is appended to ``ran`` when given."""
    from jupyter_distrain.client.job import Job
    from jupyter_distrain.contract.process import ProcessId

    started = time.time()
    printed = io.StringIO()
    stdout, sys.stdout = sys.stdout, printed
    try:  # followed to its end, as a cell is (and so with the supervisor on standby)
        shell.run_cell_magic("distributed", f"--workers 2 {flags}", code)
    finally:
        sys.stdout = stdout
    job = Job.attach(re.search(r"^Job (\S+):", printed.getvalue(), re.M).group(1))
    if ran is not None:
        ran.append(job)
    first, rate = parse(job.dir.log_file(ProcessId("worker", 0)).read_text())
    return first - started, rate


@contextlib.contextmanager
def bench_session(steps: int, program: str = SCRIPT) -> Iterator[tuple[Path, str, Path, Any]]:
    """A temporary directory (holding the jobs root unless one is set), the benchmark
    ``program`` for ``steps`` steps as code and as a script file, and an IPython shell
    with the extension loaded."""
    from IPython.core.interactiveshell import InteractiveShell

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        code = program.format(steps=steps)
        script = Path(tmp) / "bench_keras.py"
        script.write_text(code)
        shell = InteractiveShell.instance()
        shell.extension_manager.load_extension("jupyter_distrain")
        yield Path(tmp), code, script, shell


def mean_with_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean and its 95% confidence interval (Student's t)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, mean, mean
    try:
        from scipy.stats import t

        critical = float(t.ppf(0.975, len(values) - 1))
    except ImportError:
        critical = 1.96
    half = critical * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


AT_END = "refill at end"  # warm, the pool refilled when the job ends (not one run ahead)
NO_STANDBY = "no standby"  # warm, the supervisor started cold (the kernel's standby ended)
NO_CACHE = "no compile cache"  # warm, an empty compilation cache (what the cache saves)
POOLED = ("warm", AT_END, NO_STANDBY, NO_CACHE)  # columns that start from a ready pool


def print_pool_memory() -> None:
    """What the pool holds: its zygote, and each idle process alone (forked from it)."""
    import psutil

    from jupyter_distrain.pool import client
    from jupyter_distrain.pool.stock import private_bytes

    for info in client.list_pools():
        zygote = psutil.Process(info.zygote).memory_info().rss if info.zygote else 0
        alone = [private_bytes(pid) / 2**20 for pid in info.idle]
        print(
            f"pool {info.kind}: zygote {zygote / 2**20:.0f} MiB resident; each idle process "
            f"holds alone {', '.join(f'{m:.1f}' for m in alone)} MiB"
        )


def run_column(
    name: str, shell: Any, code: str, script: Path, flags: str, framework: str
) -> tuple[float, float]:
    """One run of the column ``name``."""
    if name == FRAMEWORKS[framework][1]:
        return FRAMEWORKS[framework][2](script)
    if name == "floor":
        return FLOORS[framework](script)
    if name == "distributed":
        return run_distributed(shell, code, f"--no-pool {flags}")
    if name == AT_END:
        return run_distributed(shell, code, f"--env JUPYTER_DISTRAIN_POOL_AHEAD=0 {flags}")
    if name == NO_CACHE:  # an empty cache each run; a JAX_ variable would key a pool of its own
        empty = tempfile.mkdtemp(prefix="no-compile-cache-")
        try:
            return run_distributed(shell, code, f"--env XDG_CACHE_HOME={empty} {flags}")
        finally:
            shutil.rmtree(empty, ignore_errors=True)
    if name == NO_STANDBY:
        from jupyter_distrain.client import standby

        standby.discard()  # then a warm run, its supervisor started cold
    return run_distributed(shell, code, flags)  # warm, back to back, no standby


def run_round(
    units: list[list[str]],
    index: int,
    shell: Any,
    code: str,
    script: Path,
    flags: str,
    args: argparse.Namespace,
) -> dict[str, tuple[float, float]]:
    """One round: every column once, in ``units``' order; a run that fails is run again
    once (a second failure fails the round)."""
    figures = {}
    for unit in units:
        for name in unit:
            try:
                res = run_column(name, shell, code, script, flags, args.framework)
            except (RuntimeError, subprocess.SubprocessError) as exc:
                print(f"round {index + 1} {name}: failed ({exc!s:.200}), again", flush=True)
                res = run_column(name, shell, code, script, flags, args.framework)
            figures[name] = res
            print(
                f"round {index + 1} {name:<14} first step {res[0]:6.2f} s  {res[1]:7.1f} steps/s",
                flush=True,
            )
        if unit[0] in POOLED:
            wait_for_pool()  # its refill imports: not beside the next run
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--no-instrument",
        action="store_true",
        help="switch off the Keras metrics in %%distributed (to see what they cost)",
    )
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="keras")
    parser.add_argument(
        "--columns",
        help="run only these columns, comma-separated (say 'warm,distributed' for more "
        "paired rounds of one question in the same time)",
    )
    args = parser.parse_args()
    program, by_hand, run_by_hand = FRAMEWORKS[args.framework]

    with bench_session(args.steps, program) as (tmp, code, script, shell):
        floor = [["floor"]] if args.framework in FLOORS else []
        # rotated as units: "back to back" runs straight after "warm", as a re-run does
        units = [[by_hand], ["distributed"], ["warm", "back to back"], [AT_END], [NO_STANDBY]]
        units += floor
        units += [[NO_CACHE]] if args.framework == "jax" else []
        if args.columns:
            wanted = args.columns.split(",")
            units = [kept for unit in units if (kept := [n for n in unit if n in wanted])]
        columns = [name for unit in units for name in unit]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in columns}
        flags = "--env JUPYTER_DISTRAIN_INSTRUMENT=0" if args.no_instrument else ""
        run_distributed(shell, code, flags)  # primes the pool
        wait_for_pool()
        skipped = 0
        for i in range(args.rounds):
            turn = i % len(units)
            try:
                this_round = run_round(
                    units[turn:] + units[:turn], i, shell, code, script, flags, args
                )
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                # the round is left out whole (the columns stay paired), never the benchmark
                skipped += 1
                print(f"round {i + 1} skipped: {type(exc).__name__}: {exc}"[:400], flush=True)
                continue
            for name, res in this_round.items():
                results[name].append(res)
        if skipped:
            print(f"{skipped} of {args.rounds} rounds skipped (a run failed twice)")
        print_pool_memory()
        from jupyter_distrain.pool import client

        client.drain()

    med = {
        name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for name, rs in results.items()
    }
    print()
    print(f"{'launcher':<16}{'time to first step (s)':>24}{'steps/sec':>12}")
    for name, (first, rate) in med.items():
        print(f"{name:<16}{first:>24.2f}{rate:>12.1f}")
    # the runs of a round ran back to back: pairing them cancels the machine's drifts
    save_rounds(f"launch_overhead-{args.framework}", args, results)
    pairings = [(name, by_hand) for name in ("distributed", *POOLED, "back to back")]
    pairings += [("warm", "distributed"), ("back to back", "distributed"), ("warm", AT_END)]
    pairings += [("warm", NO_STANDBY), ("warm", NO_CACHE)]
    if "floor" in results:
        pairings += [("floor", by_hand), ("distributed", "floor")]
    for name, other in [(n, o) for n, o in pairings if n in results and o in results]:
        pairs = list(zip(results[name], results[other], strict=True))
        for label, column in (("time to first step", 0), ("steps/sec", 1)):
            ratios = [d[column] / h[column] for d, h in pairs]
            mean, low, high = mean_with_interval(ratios)
            print(
                f"{name}/{other} {label}: mean of per-round ratios {mean:.3f} (95% CI "
                f"{low:.3f}-{high:.3f}, {len(ratios)} rounds; median "
                f"{statistics.median(ratios):.3f})"
            )
    return 0


def save_rounds(name: str, args: argparse.Namespace, rounds: dict[str, Any]) -> None:
    """The raw per-round figures, in ``benchmarks/results/NAME-<time>.json``."""
    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    print(f"raw figures: {path}")


if __name__ == "__main__":
    sys.exit(main())
