"""``--backend jax`` with real JAX (CPU, Gloo collectives) and Keras 3 on its JAX backend:
an all-gather across two processes gives the known result with
``jax.distributed.initialize()`` called with no arguments; a Keras 3 ``DataParallel``
cell ends with identical weights, its steps in the widget with no code change; a
crash fails the job fast with its traceback; a scale resumes from the epoch where it
was; Stop and a port scan find nothing left or reachable; bad input is one line."""

from __future__ import annotations

import json
import re

import pytest
from conftest import failed_seconds_after_exit, fault_row, refusals_without, wait_for
from jobscan import left_after, processes_of
from netprobe import listening_sockets, other_host_namespace, port_open
from test_pool import _ready_pool, pool_on  # noqa: F401  (pool_on: a fixture)
from test_session import check_backend_session

from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.client.widget.model import JobModel
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.store import list_job_dirs

pytestmark = pytest.mark.jax

ALLGATHER = """\
import os
import jax, numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize()
gathered = multihost_utils.process_allgather(np.array([jax.process_index() * 10 + 1]))
print(f"process {jax.process_index()} of {jax.process_count()} "
      f"gathered {gathered.ravel().tolist()} devices {jax.device_count()} "
      f"coordinator {os.environ['JAX_COORDINATOR_ADDRESS']}", flush=True)
"""
GATHERED = re.compile(r"process (\d) of (\d) gathered (\[.*\]) devices (\d) coordinator (\S+)")

KERAS_DATA_PARALLEL = """\
import os
os.environ["KERAS_BACKEND"] = "jax"
import hashlib
import jax, keras, numpy as np
from sklearn.datasets import load_digits
keras.distribution.initialize()
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
rank, world = jax.process_index(), jax.process_count()
x, y = load_digits(return_X_y=True)
x = (x / 16).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10),
])
model.compile(optimizer=keras.optimizers.SGD(0.2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x[rank::world][:448], y[rank::world][:448], batch_size=32, epochs=EPOCHS, verbose=0)
w = model.get_weights()
logits = np.maximum(x @ w[0] + w[1], 0) @ w[2] + w[3]
digest = hashlib.sha256(b"".join(a.tobytes() for a in w)).hexdigest()[:16]
print(f"process {rank} of {world} weights {digest} "
      f"accuracy {(logits.argmax(1) == y).mean():.3f}", flush=True)
"""
TRAINED = re.compile(r"process (\d) of (\d) weights (\w+) accuracy ([\d.]+)")
STEPS_PER_EPOCH = 448 // 32


def test_two_processes_all_gather_with_no_arguments_to_initialize(jobs_root):
    job = submit(JobSpec(code=ALLGATHER, workers=2))
    assert job.spec.backend == "jax"  # auto: the cell imports jax and not TensorFlow
    assert job.backend_reason.startswith("the cell imports jax and not TensorFlow")
    assert job.wait(180) == "succeeded", job.status().error
    said = [GATHERED.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert [m.group(1, 2, 3, 4) for m in said] == [
        ("0", "2", "[1, 11]", "2"),
        ("1", "2", "[1, 11]", "2"),
    ]
    coordinator = job.status().backend_info["coordinator"]
    assert {m.group(5) for m in said} == {coordinator}
    assert coordinator.startswith("127.0.0.1:")  # inside the job's namespace
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_a_keras_3_data_parallel_cell_ends_with_identical_weights_and_its_steps_shown(
    jobs_root,
):
    code = "EPOCHS = 4\n" + KERAS_DATA_PARALLEL
    job = submit(JobSpec(code=code, workers=2))
    assert job.spec.backend == "jax"
    assert job.backend_reason.startswith("the cell runs Keras on JAX and not TensorFlow")
    assert job.spec.keras == "native" and job.notes == []  # no tf-keras note: Keras 3 on JAX
    assert job.wait(240) == "succeeded", job.status().error
    said = [TRAINED.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert [m.group(1, 2) for m in said] == [("0", "2"), ("1", "2")]
    assert said[0].group(3) == said[1].group(3)  # identical weights
    assert float(said[0].group(4)) > 0.8
    # Keras 3's fit on JAX, instrumented: one step per batch, 32 images each, the loss
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    for index in (0, 1):
        steps = [r for r in records if r["index"] == index and "step" in r]
        assert [r["step"] for r in steps] == list(range(1, 4 * STEPS_PER_EPOCH + 1))
        assert {r["images"] for r in steps} == {32}
        assert steps[-1]["loss"] < steps[0]["loss"]
        assert steps[-1]["total_steps"] == 4 * STEPS_PER_EPOCH


def test_a_rerun_reuses_the_compiled_programs_and_ends_with_the_same_weights(jobs_root, tmp_path):
    """The persistent compilation cache (``worker/compile_cache.py``) in the user's cache
    directory: the first run compiles and rank 0 writes, the second run's ranks reuse what
    it compiled (the widget says how much) and train to the same weights."""
    cache = tmp_path / "cache"
    code = "EPOCHS = 1\n" + KERAS_DATA_PARALLEL
    runs = []
    for _ in range(2):
        job = submit(JobSpec(code=code, workers=2, env={"XDG_CACHE_HOME": str(cache)}))
        assert job.wait(240) == "succeeded", job.status().error
        said = [TRAINED.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
        assert all(said), job.logs()
        model = JobModel(job)
        model.update()
        runs.append(({m.group(3) for m in said}, dict(model.compiled), model))
    (first_weights, first, _), (second_weights, second, model) = runs
    assert len(first_weights) == 1 and first_weights == second_weights
    worker_0, worker_1 = ProcessId("worker", 0), ProcessId("worker", 1)
    reused, compiled = first[worker_0]
    assert compiled > 0 and reused == 0, first
    for process in (worker_0, worker_1):
        reused, compiled = second[process]
        assert compiled > 0 and reused > compiled // 2, second
    assert (
        model.compile_cache_text()
        == f"{second[worker_0][0]} of {second[worker_0][1]} compiled programs reused"
    )
    (kept,) = (cache / "jupyter_distrain" / "xla").iterdir()  # this environment's JAX
    assert len(list(kept.iterdir())) >= first[worker_0][1] // 2
    for directory in (cache / "jupyter_distrain", kept.parent, kept):
        assert directory.stat().st_mode & 0o777 == 0o700


CRASHING = """\
import time
import jax, numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize()
if jax.process_index() == 1:
    time.sleep(0.5)
    raise ValueError("bad batch on process one")
multihost_utils.process_allgather(np.ones(1))  # process 0 waits here for one that is gone
time.sleep(120)
"""


def test_a_crashing_process_fails_the_job_fast_with_its_traceback(jobs_root):
    job = submit(JobSpec(code=CRASHING, workers=2, backend="jax", grace=2))
    wait_for(lambda: job.done, 120, what="the job to end")
    status = job.status()
    assert status.state == "failed"
    assert status.error.startswith("rank 1 failed first"), status.error
    assert "ValueError: bad batch on process one" in job.logs(ProcessId("worker", 1))
    assert failed_seconds_after_exit(job.dir) < 2.0
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


WAITING = """\
import time
import jax, numpy as np
from jax.experimental import multihost_utils
jax.distributed.initialize()
multihost_utils.process_allgather(np.ones(1))  # Gloo's connections are up
print("up", flush=True)
time.sleep(600)
"""


@pytest.mark.root  # a second host (network namespace)
def test_a_port_scan_from_another_host_finds_nothing_then_stop_leaves_nothing(jobs_root):
    job = submit(JobSpec(code=WAITING, workers=2, backend="jax", grace=1))
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in (0, 1)]
    up = lambda: all(log.exists() and "up" in log.read_text() for log in logs)  # noqa: E731
    wait_for(up, 120, what="both processes up")
    port = int(job.status().backend_info["coordinator"].rpartition(":")[2])
    processes = processes_of(job.dir.path)
    listening = {(a, p) for proc in processes for a, p in listening_sockets(proc.pid)}
    # the coordinator, on rank 0's slot address only (a v4-mapped address of a v6 socket)
    assert {a for a, p in listening if p == port} == {"::ffff:127.0.0.1"}
    with other_host_namespace() as (namespace, address):
        reachable = [p for _, p in sorted(listening) if port_open(namespace, address, p)]
    assert job.stop() == "stopped"
    left = left_after(lambda: processes_of(job.dir.path), 10)
    fault_row("port scan (jax job: coordinator, Gloo)", not reachable, job.state, len(left))
    assert reachable == [] and left == []
    # ended by the SIGTERM, not the SIGKILL a grace later (JAX's preemption service is off)
    assert "ignored SIGTERM" not in job.dir.supervisor_log.read_text()


HANGING = """\
import os, time
os.environ["KERAS_BACKEND"] = "jax"
import jax, keras, numpy as np
from jax.experimental import multihost_utils
keras.distribution.initialize()
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
x = np.ones((64, 4), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=32, epochs=2, verbose=0)  # 4 steps
if jax.process_index() == 1:
    time.sleep(600)  # hangs; process 0 waits for it in the all-gather
multihost_utils.process_allgather(np.ones(1))
"""


def test_a_process_hanging_in_a_collective_is_named_by_the_stall_warning(jobs_root):
    job = submit(JobSpec(code=HANGING, workers=2, backend="jax", stall_timeout=3, grace=1))
    wait_for(lambda: job.status().warnings or job.done, 120, what="the stall warning")
    (warning,) = job.status().warnings
    assert warning.startswith("training stalled: no step since"), warning
    assert "at step 4" in warning and "rank 0" in warning and "rank 1" in warning, warning
    assert job.stop() == "stopped"  # both, the one in the collective included
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_an_interrupt_in_the_kernel_stops_every_process(kernel, jobs_root):
    msg_id = kernel.submit("%%distributed --workers 2 --backend jax --grace 2\n" + WAITING)
    job_dir = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    logs = [job_dir.log_file(ProcessId("worker", i)) for i in (0, 1)]
    up = lambda: all(log.exists() and "up" in log.read_text() for log in logs)  # noqa: E731
    wait_for(up, 120, what="both processes up")
    assert len(processes_of(job_dir.path)) >= 2
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] in ("KeyboardInterrupt", "JobInterrupted")
    assert left_after(lambda: processes_of(job_dir.path), 10) == []
    assert job_dir.read_state().state == "stopped"


SCALABLE = """\
import os, time
os.environ["KERAS_BACKEND"] = "jax"
import jax, keras, numpy as np
keras.distribution.initialize()
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
rank, world = jax.process_index(), jax.process_count()
rng = np.random.default_rng(rank)
x = rng.normal(size=(128, 8)).astype("float32")
y = x.sum(1, keepdims=True)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")


class Said(keras.callbacks.Callback):
    # says where this run starts: its first epoch, the loss after its first batch
    def on_epoch_begin(self, epoch, logs=None):
        self.first = getattr(self, "first", epoch)
    def on_train_batch_end(self, batch, logs=None):
        if not getattr(self, "said", False):
            print(f"epoch {self.first} world {world} loss {float(logs['loss']):.4f}", flush=True)
            self.said = True
        time.sleep(0.05)
    def on_epoch_end(self, epoch, logs=None):
        print(f"done {epoch}", flush=True)


model.fit(x, y, batch_size=32, epochs=200, verbose=0, callbacks=[Said()])
"""
FIRST_BATCH = re.compile(r"epoch (\d+) world (\d) loss ([\d.]+)")


def test_scale_2_to_3_resumes_at_the_epoch_where_it_was(jobs_root):
    """Keras 3's fit on JAX: the scale backs up the weights and the epoch at an epoch end
    (every process, after agreeing on the request), and the three processes of the next
    generation restore them and go on from the next epoch, the loss where it was."""
    job = submit(JobSpec(code=SCALABLE, workers=2, backend="jax", grace=2))
    log = job.dir.log_file(ProcessId("worker", 0))

    def starts(path) -> list[tuple[str, str, str]]:
        text = path.read_text() if path.exists() else ""
        return FIRST_BATCH.findall(text)

    wait_for(lambda: log.exists() and "done 1\n" in log.read_text(), 120, what="two epochs")
    job.scale(3)
    wait_for(lambda: job.status().generation == 1 and job.state == "running", 120, what="restart")
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in range(3)]
    wait_for(
        lambda: all(len(starts(p)) == (2 if i < 2 else 1) for i, p in enumerate(logs)),
        120,
        what="the three processes of the next generation",
    )
    runs = [starts(p) for p in logs]
    assert [r[0][:2] for r in runs[:2]] == [("0", "2"), ("0", "2")]  # generation 0: fresh
    resumed = {run[-1][:2] for run in runs}
    assert len(resumed) == 1  # one epoch, world 3 on every process
    epoch, world = resumed.pop()
    assert world == "3" and int(epoch) >= 1
    assert float(runs[0][-1][2]) < float(runs[0][0][2]) / 2  # the loss went on, not reset
    assert job.stop() == "stopped"
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_parameter_servers_with_jax_are_one_line_and_launch_nothing(jobs_root):
    with pytest.raises(SpecError, match=r"^--ps is for the parameter-server backend"):
        submit(JobSpec(code="import jax\n", workers=2, ps=2, backend="jax"))
    assert list(jobs_root.iterdir()) == []


def test_without_jax_the_backend_is_one_line_naming_the_install(jobs_root):
    lines = refusals_without("jax")
    assert len(lines) == 2, lines
    assert lines[0].startswith("--backend jax: jax is not installed: pip install")
    assert lines[1].startswith("--backend auto: the cell imports jax, but jax is not")
    assert list(jobs_root.iterdir()) == []


def test_auto_picks_jax_for_keras_on_jax_and_not_beside_another_framework(jobs_root):
    from jupyter_distrain.backends.choice import resolve_backend

    keras_on_jax = 'import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\n'
    assert resolve_backend(JobSpec(code=keras_on_jax, workers=2))[0] == "jax"
    by_env = JobSpec(code="import keras\n", workers=2, env={"KERAS_BACKEND": "jax"})
    assert resolve_backend(by_env)[0] == "jax"
    assert resolve_backend(JobSpec(code="import jax, torch\n", workers=2))[0] != "jax"
    assert resolve_backend(JobSpec(code="import jax, tensorflow\n", workers=2))[0] != "jax"


def test_bench_runs_jax_on_the_same_resnet_and_says_its_framework(jobs_root):
    from jupyter_distrain.client import bench

    tiny = {"image_size": 8, "width": 4, "blocks": 1, "batch_size": 8, "steps": 5, "epochs": 2}
    settings = bench.BenchSettings(workers=1, backends=["jax"], **tiny)  # 2: the tests above
    rows, _ = bench.run(settings, progress=lambda line: None)
    assert [(r.backend, r.framework, r.workers) for r in rows] == [("jax", "JAX", 1)]
    assert all(r.images_per_sec > 0 for r in rows)


@pytest.mark.usefixtures("pool_on")
def test_a_rerun_takes_warm_jax_processes_and_gathers_the_same():
    """The jax pool kind: jax (and Keras) imported, no device touched; the second run's
    processes are claimed from it and all-gather as the first run's did."""
    first = submit(JobSpec(code=ALLGATHER, workers=2, backend="jax"))
    assert first.wait(180) == "succeeded", first.status().error
    assert [p.pooled for p in first.status().processes] == [False, False]
    idle = _ready_pool().idle
    second = submit(JobSpec(code=ALLGATHER, workers=2, backend="jax"))
    assert second.wait(180) == "succeeded", second.status().error
    rows = second.status().processes
    assert [p.pooled for p in rows] == [True, True]
    assert sorted(p.pid for p in rows) == sorted(idle)
    said = [GATHERED.search(second.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert [m.group(3) for m in said] == ["[1, 11]", "[1, 11]"]


INITIALIZE_IMPORTS = """\
import sys
import keras
before = set(sys.modules)
keras.distribution.initialize()
print("initialize imported", sorted(m for m in set(sys.modules) - before if "." not in m))
"""


@pytest.mark.usefixtures("pool_on")
def test_a_warm_keras_process_has_what_keras_initialize_imports_already():
    """keras.distribution.initialize() seeds TensorFlow's generator too, importing
    TensorFlow where it is installed: 1.6 s of a warm Keras 3 job's 2.5 s to its first
    step, until the jax pool imported it ahead."""
    first = submit(JobSpec(code=INITIALIZE_IMPORTS, workers=2, backend="jax"))
    assert first.wait(180) == "succeeded", first.status().error
    assert "'tensorflow'" in first.logs(ProcessId("worker", 0))  # cold: it imports it
    _ready_pool()
    second = submit(JobSpec(code=INITIALIZE_IMPORTS, workers=2, backend="jax"))
    assert second.wait(180) == "succeeded", second.status().error
    assert [p.pooled for p in second.status().processes] == [True, True]
    assert "initialize imported []" in second.logs(ProcessId("worker", 0))


def test_a_jax_session_gathers_across_cells(kernel, jobs_root):
    check_backend_session(
        kernel,
        jobs_root,
        "jax",
        "import jax, numpy as np\nfrom jax.experimental import multihost_utils\n"
        "jax.distributed.initialize()\n",
        "result = int(multihost_utils.process_allgather(np.array([rank + 1])).sum())\n",
    )
