"""Elastic Horovod from the + and - buttons (``Job.scale``), with real ranks: Horovod's
documented Keras path with Keras's default optimizer, scaling down on both paths, a
resize that cannot complete failing with its phase named, and the stall warning."""

from __future__ import annotations

import json
import re

import pytest
from conftest import wait_for
from jobscan import processes_of
from test_metrics_widget import ELASTIC

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract.process import ProcessId

# The cell of the issue, verbatim: Horovod's elastic Keras example.
pytestmark = pytest.mark.horovod  # needs Horovod: not run on current TensorFlow

KERAS_ELASTIC = """\
import json, os, numpy as np, tensorflow as tf, horovod.tensorflow.keras as hvd
hvd.init()
x = np.random.default_rng(0).random((512, 16)).astype("float32"); y = (x.sum(1) > 8).astype("int32")
model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
@hvd.elastic.run
def train(state):
    model.fit(x, y, batch_size=16, epochs=30, initial_epoch=state.epoch, verbose=0,
              callbacks=[hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state)])
train(state)
"""
STEPS_PER_EPOCH, EPOCHS = 32, 30


def _steps(job, process: ProcessId) -> list[int]:
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    return [r["step"] for r in records if ProcessId.of(r) == process and "step" in r]


def _scale_when_training(job, workers: int, step: int = 200) -> dict[int, int]:
    wait_for(lambda: job.state == "running", 60, what="running")
    wait_for(
        lambda: all((p.step or 0) >= step for p in job.status().processes), 120, what="training"
    )
    pids = {p.index: p.pid for p in job.status().processes}
    job.scale(workers)
    return pids


def test_the_documented_keras_elastic_cell_scales_up_in_place(jobs_root):
    job = submit(JobSpec(code=KERAS_ELASTIC, workers=2, grace=3))
    pids = _scale_when_training(job, 3)
    assert job.wait(timeout=240) == "succeeded"
    status = job.status()
    procs = {p.index: p for p in status.processes}
    assert procs[0].pid == pids[0] and procs[1].pid == pids[1] and procs[2].pid not in pids.values()
    joined = _steps(job, ProcessId("worker", 2))
    assert joined and joined[0] > 2 * STEPS_PER_EPOCH  # resumed from the committed epoch
    for i in range(3):
        assert _steps(job, ProcessId("worker", i))[-1] == STEPS_PER_EPOCH * EPOCHS
    kinds = [e["event"] for e in job.dir.read_events()]
    assert "scaled_in_place" in kinds and "scaled" in kinds and "restart" not in kinds


def test_the_keras_elastic_cell_scales_down_in_place(jobs_root):
    job = submit(JobSpec(code=KERAS_ELASTIC, workers=3, grace=3))
    pids = _scale_when_training(job, 2)
    assert job.wait(timeout=240) == "succeeded"
    procs = {p.index: p for p in job.status().processes}
    assert procs[0].pid == pids[0] and procs[1].pid == pids[1]
    assert procs[2].stopped and procs[2].state == "killed"
    assert _steps(job, ProcessId("worker", 0))[-1] == STEPS_PER_EPOCH * EPOCHS


def test_a_custom_elastic_loop_scales_down_in_place(jobs_root):
    job = submit(JobSpec(code="STEPS = 400\n" + ELASTIC, workers=3, grace=3))
    wait_for(lambda: job.state == "running", 60, what="running")
    log0 = job.dir.log_file(ProcessId("worker", 0))
    wait_for(lambda: log0.exists() and "size 3" in log0.read_text(), 120, what="size 3")
    job.scale(2)
    assert job.wait(timeout=240) == "succeeded", job.logs()[-3000:]
    for i in range(2):
        text = job.dir.log_file(ProcessId("worker", i)).read_text()
        assert re.search(r"^done rank \d size 2 pid \d+$", text, re.M), text[-2000:]


STUCK = ELASTIC.replace(
    "state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0, sizes=[])",
    # TensorFlowState broadcasts in its constructor: a joining worker waits there for
    # ranks that are not broadcasting, and the resize can never complete
    "state = hvd.elastic.TensorFlowState(model.variables, step=0, sizes=[])",
)


def test_a_resize_that_cannot_complete_fails_naming_its_phase(jobs_root):
    job = submit(JobSpec(code="STEPS = 100000\n" + STUCK, workers=2, grace=2, timeout=25))
    wait_for(lambda: job.state == "running", 60, what="running")
    log0 = job.dir.log_file(ProcessId("worker", 0))
    wait_for(lambda: log0.exists() and "size 2" in log0.read_text(), 120, what="size 2")
    job.scale(3)
    wait_for(lambda: job.status().done, 90, what="the resize to time out")
    status = job.status()
    assert status.state == "failed"
    assert status.error.startswith("scaling to 3 workers did not complete within 25 s: stuck in ")
    wait_for(lambda: not processes_of(job.dir.path), 15, what="nothing left")


def test_an_elastic_job_whose_every_rank_fails_is_failed_not_succeeded(jobs_root):
    code = ELASTIC.replace("hvd.init()", "hvd.init()\nraise ValueError('bad data')", 1)
    job = submit(JobSpec(code="STEPS = 10\n" + code, workers=2, grace=2))
    wait_for(lambda: job.status().done, 120, what="the end")
    status = job.status()
    assert status.state == "failed", status
    assert status.error.startswith("every elastic worker failed (localhost[0] exit code 1")


def test_a_stall_is_said_in_the_cell_naming_the_ranks(kernel):
    cell = (
        "%%distributed --workers 2 --backend horovod --stall-timeout 2\n"
        "import time, jupyter_distrain as jd\n"
        "for i in range(1, 31):\n"
        "    jd.report(step=i)\n"
        "    time.sleep(0.02 if i != 10 else 6)\n"
    )
    out = kernel.execute(cell, timeout=120)
    assert out.error is None, out.error_text
    assert "Warning: training stalled: no step since" in out.stderr
    assert "rank 0 at step 10" in out.stderr and "rank 1 at step 10" in out.stderr
