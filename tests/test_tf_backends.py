"""Parameter servers (TF2 strategy and the seed's TF1 contract) and TF collective allreduce,
all real TensorFlow servers in separate processes, launched from a real kernel."""

from __future__ import annotations

import os
import re
import signal
import time

from conftest import job_pids, only_job, running, wait_for
from test_session import check_backend_session

from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.store import list_job_dirs

DIGITS = """\
import numpy as np
from sklearn.datasets import load_digits
digits = load_digits()
order = np.random.default_rng(0).permutation(len(digits.data))
X = (digits.data[order] / 16.0).astype("float32")
Y = digits.target[order].astype("int64")
x_train, y_train, x_val, y_val = X[:1440], Y[:1440], X[1440:], Y[1440:]
"""

PS_STRATEGY_FIT = (
    DIGITS
    + """\
import tensorflow as tf
import jupyter_distrain

strategy = jupyter_distrain.strategy()

def dataset_fn(input_context):
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1440, seed=1)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.repeat().batch(32)

class Progress(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch} done", flush=True)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.01),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),
          epochs=EPOCHS, steps_per_epoch=30, verbose=0, callbacks=[Progress()])
logits = model(x_val).numpy()
accuracy = float((logits.argmax(1) == y_val).mean())
print(f"validation accuracy {accuracy:.3f}")
result = {"devices": [v.device for v in model.variables], "val_accuracy": accuracy,
          "strategy": type(strategy).__name__}
"""
)


def test_parameter_server_strategy_places_variables_on_ps_and_learns(kernel, jobs_root):
    out = kernel.execute(
        "%%distributed --ps 1 --workers 2 --out summary\nEPOCHS = 6\n" + PS_STRATEGY_FIT
    )
    assert out.error is None, out.error_text + out.stdout[-3000:]
    assert "backend ps (--ps given)" in out.stdout
    out = kernel.execute(
        "print(summary['strategy'], summary['val_accuracy'])\nprint(summary['devices'])"
    )
    assert out.stdout.startswith("ParameterServerStrategy")
    devices = eval(out.stdout.splitlines()[1])
    assert devices and all(d.startswith("/job:ps/") for d in devices), devices
    assert float(out.stdout.split()[1]) >= 0.85
    state = only_job(jobs_root).read_state()
    assert sorted(p.role for p in state.processes) == ["chief", "ps", "worker", "worker"]
    assert set(state.backend_info["cluster"]) == {"chief", "worker", "ps"}


SEED_PROGRAM = (
    DIGITS
    + """\
import tensorflow as tf

N_WORKERS, LAST_STEP = 2, 40

def run(cluster, server, task_index):
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{task_index}", cluster=cluster)):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 64])
        y = tf.compat.v1.placeholder(tf.int64, [None])
        w = tf.compat.v1.get_variable("w", [64, 10], initializer=tf.compat.v1.zeros_initializer())
        b = tf.compat.v1.get_variable("b", [10], initializer=tf.compat.v1.zeros_initializer())
        logits = tf.matmul(x, w) + b
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        if SYNC:
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=N_WORKERS, total_num_replicas=N_WORKERS)
        train_op = optimizer.minimize(loss, global_step=global_step)
    is_chief = task_index == 0
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=LAST_STEP)]
    if SYNC:
        hooks.append(optimizer.make_session_run_hook(is_chief))
    rng = np.random.default_rng(task_index)
    # talk only to the ps and this task: a worker that has finished takes its server along
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task_index}"])
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, hooks=hooks, config=config,
            stop_grace_period_secs=2) as sess:
        while not sess.should_stop():
            batch = rng.integers(0, len(x_train), 64)
            sess.run(train_op, {x: x_train[batch], y: y_train[batch]})
    if is_chief:
        with tf.compat.v1.Session(server.target, config=config) as plain:
            step, acc = plain.run([global_step, accuracy], {x: x_val, y: y_val})
        print(f"final global_step {step} accuracy {acc:.3f}", flush=True)
"""
)


def _seed_run(kernel, sync: bool):
    cell = "%%distributed --ps 1 --workers 2 --grace 2\n" + f"SYNC = {sync}\n" + SEED_PROGRAM
    out = kernel.execute(cell)
    assert out.error is None, out.error_text + out.stdout[-3000:]
    match = re.search(r"^\[0\] final global_step (\d+) accuracy ([\d.]+)$", out.stdout, re.M)
    assert match, out.stdout[-3000:]
    return int(match.group(1)), float(match.group(2))


def test_seed_program_trains_with_sync_replicas(kernel, jobs_root):
    step, accuracy = _seed_run(kernel, sync=True)
    assert step == 40
    assert accuracy >= 0.8
    state = only_job(jobs_root).read_state()
    assert state.state == "succeeded" and state.backend_info["tf1_run"] is True
    assert sorted(p.role for p in state.processes) == ["ps", "worker", "worker"]


def test_seed_program_trains_asynchronously(kernel):
    step, accuracy = _seed_run(kernel, sync=False)
    assert step >= 40
    assert accuracy >= 0.8


def test_tf_collective_replicas_end_with_identical_weights(kernel):
    cell = """%%distributed --workers 2 --backend tf
import hashlib
import numpy as np
import tensorflow as tf
import jupyter_distrain

strategy = jupyter_distrain.strategy()
x = np.random.default_rng(0).random((256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
history = model.fit(data, epochs=3, steps_per_epoch=10, verbose=0)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
print(type(strategy).__name__, strategy.num_replicas_in_sync, "weights", digest,
      "loss", history.history["loss"][0] > history.history["loss"][-1])
"""
    out = kernel.execute(cell)
    assert out.error is None, out.error_text + out.stdout[-3000:]
    found = re.findall(
        r"^\[(\d)\] (?:MultiWorkerMirrored|CollectiveAllReduce)Strategy 2 weights (\w+) loss True$",
        out.stdout,
        re.M,
    )
    assert len(found) == 2 and found[0][1] == found[1][1], out.stdout[-2000:]


def test_a_tf_collective_session_reduces_across_cells(kernel, jobs_root):
    check_backend_session(
        kernel,
        jobs_root,
        "tf",
        "import tensorflow as tf\nimport jupyter_distrain\nstrategy = jupyter_distrain.strategy()\n",
        "one = strategy.run(lambda: tf.constant(rank + 1))\n"
        "result = int(strategy.reduce('SUM', one, axis=None))\n",
    )


def test_a_parameter_server_session_keeps_its_variables_on_the_ps_across_cells(kernel, jobs_root):
    """The chief runs the cells (the workers and the ps serve): a variable placed on the
    ps by the first cell is there, updated, in the next ones."""
    out = kernel.execute(
        "%%distributed --session p --ps 1 --workers 2\nimport tensorflow as tf\n"
        "import jupyter_distrain\nstrategy = jupyter_distrain.strategy()\n"
        "with strategy.scope():\n    v = tf.Variable(1.0)\n"
    )
    assert out.error is None, out.error_text + out.stdout[-3000:]
    job = Job(only_job(jobs_root))
    for expected in (3.0, 5.0):
        out = kernel.execute(
            "%%distributed --session p --out val\nresult = float(v.assign_add(2.0))\n"
        )
        assert out.error is None, out.error_text + out.stdout[-3000:]
        assert kernel.execute("print(val)").stdout.strip() == str(expected)
    pids = job_pids(job.dir)
    kernel.execute("%distributed stop p")
    wait_for(lambda: not any(running(p) for p in pids), 15, what="the session's processes to end")


def _start_long_ps_job(kernel, jobs_root):
    msg_id = kernel.submit(
        "%%distributed --ps 1 --workers 2 --grace 2\nEPOCHS = 200\n" + PS_STRATEGY_FIT
    )
    job = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    wait_for(
        lambda: (
            "epoch 1 done" in job.log_file(ProcessId("chief", 0)).read_text()
            if job.log_file(ProcessId("chief", 0)).exists()
            else False
        ),
        120,
        what="training",
    )
    return msg_id, job


def test_killing_the_ps_fails_the_job_within_5_s_naming_it(kernel, jobs_root):
    msg_id, job = _start_long_ps_job(kernel, jobs_root)
    ps = next(p for p in job.read_state().processes if p.role == "ps")
    pids = job_pids(job)
    killed_at = time.monotonic()
    os.kill(ps.pid, signal.SIGKILL)
    wait_for(lambda: job.read_state().state == "failed", 5, what="the job to fail")
    assert time.monotonic() - killed_at < 5
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and "ps 0 died" in out.error["evalue"]
    wait_for(lambda: not any(running(p) for p in pids), 5, what="every process gone")


def test_losing_a_worker_under_parameter_server_strategy_is_survived(kernel, jobs_root):
    cell = (
        "%%distributed --ps 1 --workers 2 --grace 2 --out summary\nEPOCHS = 20\n" + PS_STRATEGY_FIT
    )
    msg_id = kernel.submit(cell)
    job = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    chief_log = job.log_file(ProcessId("chief", 0))
    wait_for(
        lambda: chief_log.exists() and "epoch 1 done" in chief_log.read_text(), 120, what="training"
    )
    worker = job.read_state().process(ProcessId("worker", 1))
    os.kill(worker.pid, signal.SIGKILL)
    assert "epoch 19 done" not in chief_log.read_text()  # killed mid-training
    out = kernel.collect(msg_id, timeout=240)
    assert out.error is None, out.error_text + chief_log.read_text()[-3000:]
    assert "epoch 19 done" in chief_log.read_text()
    assert job.read_state().state == "succeeded"
    assert any(
        e["event"] == "process_lost" and e["process"] == "worker-1" for e in job.read_events()
    )
