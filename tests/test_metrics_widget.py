"""Live metrics and the widget: the signed channel, Keras instrumentation, the view model,
buttons while a cell runs, scaling by checkpoint and restart. Real jobs, real TensorFlow."""

from __future__ import annotations

import html
import io
import json
import re
import time

import pytest
from conftest import STACKS_PROGRAM, only_job, wait_for, wait_until_up

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.client.follow import follow
from jupyter_distrain.client.job import Job
from jupyter_distrain.client.widget import JobModel, JobWidget, TextSummary
from jupyter_distrain.client.widget.render import header_html
from jupyter_distrain.client.widget.text import summary_line
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.status import JobStatus

KERAS_FIT = """\
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from sklearn.datasets import load_digits

hvd.init()
digits = load_digits()
x = (digits.data / 16.0).astype("float32")[hvd.rank()::hvd.size()]
y = digits.target[hvd.rank()::hvd.size()]
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Say(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch {epoch} size {hvd.size()}", flush=True)
        time.sleep(EPOCH_PAUSE)


import time
model.fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Say()])
print("finished", flush=True)
"""


@pytest.mark.horovod
def test_a_keras_job_drives_the_widget(jobs_root):
    job = submit(JobSpec(code="EPOCHS, EPOCH_PAUSE = 4, 0.5\n" + KERAS_FIT, workers=2))
    widget = JobWidget(job)
    seen_running = []

    class Watch:
        """The widget as follow() ticks it, keeping what it showed while the job ran."""

        def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
            widget.refresh(force=force, status=status)
            if widget.job_state == "running" and any(r["step"] for r in widget.rows):
                seen_running.append([dict(r) for r in widget.rows])

    started = time.monotonic()
    assert follow(job, Watch(), stream=False) == "succeeded"
    elapsed = time.monotonic() - started
    widget.refresh(force=True)
    assert seen_running, "the widget never showed a running job with steps"
    assert any(all(r["state"] == "running" and r["step"] for r in rows) for rows in seen_running)
    # 899 and 898 samples per rank, batch 16: 57 steps per epoch, 4 epochs
    assert [(r["role"], r["index"], r["state"], r["step"]) for r in widget.rows] == [
        ("worker", 0, "exited", 228),
        ("worker", 1, "exited", 228),
    ]
    assert all(r["images_per_sec"] > 0 and r["loss"] is not None for r in widget.rows)
    assert all(r["pid"] and r["host"] for r in widget.rows)
    assert widget.time_to_first_step is not None and widget.time_to_first_step > 0
    assert len(widget.model.series["worker-0"]) == 228
    assert widget.model.progress()[0] == 1.0
    assert widget.redraws <= elapsed * 4 + 3  # at most 4 redraws a second
    assert "images/sec per step" in widget.chart.value and "polyline" in widget.chart.value
    state = job.status()
    assert state.metrics_rejected == 0 and state.metrics_records >= 456
    # what a viewer without a kernel shows: the final dashboard as static HTML
    snapshot = widget._repr_mimebundle_()["text/html"]
    assert "succeeded" in snapshot and "images/sec per step" in snapshot
    final_rate = float(
        re.search(r"<b>([\d,]+)</b> images/sec at the end", snapshot)[1].replace(",", "")
    )
    assert final_rate == pytest.approx(sum(r["images_per_sec"] for r in widget.rows), abs=1)
    assert snapshot.count("<td style='padding:0 8px'>228</td>") == 2


@pytest.mark.horovod
def test_attach_after_the_end_replays_every_stored_step(jobs_root):
    job = submit(JobSpec(code="EPOCHS, EPOCH_PAUSE = 2, 0\n" + KERAS_FIT, workers=2))
    job.wait()
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    assert len(steps) == 2 * 114
    model = JobModel(type(job).attach(job.id))
    model.update()
    assert sum(len(s) for s in model.series.values()) == len(steps)
    assert [s for s, _ in model.series["worker-1"]] == list(range(1, 115))
    out = io.StringIO()
    TextSummary(type(job).attach(job.id), out=out).refresh(force=True)
    assert f"[{job.id}] succeeded" in out.getvalue() and "step 114/114" in out.getvalue()


def test_a_rank_whose_steps_take_longer_is_named_with_how_much_in_the_widget_and_the_line(
    jobs_root,
):
    code = (
        "import os, time, jupyter_distrain\n"
        "pause = 0.2 if os.environ['JUPYTER_DISTRAIN_RANK'] == '2' else 0.1\n"
        "for step in range(1, 61):\n"
        "    time.sleep(pause)\n"
        "    jupyter_distrain.report(step=step, images=8)\n"
    )
    job = submit(JobSpec(code=code, workers=3, backend="plain", grace=1))
    model = JobModel(job)

    def named() -> bool:
        model.update()
        return bool(model.stragglers()) and all((p.step or 0) > 20 for p in model.processes())

    wait_for(named, 60, what="a straggler named")
    assert list(model.stragglers()) == ["worker-2"]
    assert 1.6 < model.stragglers()["worker-2"] < 2.4  # 2x, on a busy machine
    said = re.search(r"straggling: rank 2: (\d\.\d)x the others' step time$", summary_line(model))
    assert said, summary_line(model)
    shown = html.unescape(header_html(model))
    assert (
        f"straggling: rank 2: {said.group(1)}x the others' step time (Stacks shows where)" in shown
    )
    job.stop()


def test_custom_loop_reports_through_the_api(jobs_root):
    code = (
        "import time, jupyter_distrain\n"
        "for step in range(1, 51):\n"
        "    with jupyter_distrain.timed_step(images=8) as s:\n"
        "        time.sleep(0.002)\n"
        "        s['loss'] = 1.0 / step\n"
        "jupyter_distrain.report(step=51, images=8, loss=0.01, accuracy=0.9)\n"
    )
    job = submit(JobSpec(code=code, workers=2, backend="plain"))
    assert job.wait() == "succeeded"
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    rank0 = [r for r in records if ProcessId.of(r) == ProcessId("worker", 0) and "step" in r]
    assert [r["step"] for r in rank0] == list(range(1, 52))
    assert rank0[-1]["accuracy"] == 0.9 and rank0[0]["loss"] == 1.0
    assert all(0 < r["images_per_sec"] < 8 / 0.002 for r in rank0[:50])


def _comm_opens(out):
    return {
        m["content"]["data"]["state"].get("description"): m["content"]["comm_id"]
        for m in out.messages
        if m["msg_type"] == "comm_open"
        and m["content"].get("data", {}).get("state", {}).get("_model_name") == "ButtonModel"
    }


class WidgetInBrowser:
    """The widget's comms, read from the kernel's messages and clicked as a browser would."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.messages: list[dict] = []
        self.ids = wait_for(
            lambda: self.buttons().get("Stop") and self.buttons(), 30, what="buttons"
        )

    def read(self) -> None:
        while True:
            try:
                self.messages.append(self.kernel.kc.get_iopub_msg(timeout=0.2))
            except Exception:
                return

    def buttons(self) -> dict[str, str]:
        self.read()
        return _comm_opens(type("O", (), {"messages": self.messages}))

    def click(self, description: str) -> None:
        content = {"method": "custom", "content": {"event": "click"}}
        self.kernel.kc.session.send(
            self.kernel.kc.shell_channel.socket,
            self.kernel.kc.session.msg(
                "comm_msg", {"comm_id": self.ids[description], "data": content}
            ),
        )

    def values(self) -> list[str]:
        """Every ``value`` the widget's parts were updated to so far."""
        self.read()
        return [
            m["content"]["data"]["state"]["value"]
            for m in self.messages
            if m["msg_type"] == "comm_msg"
            and isinstance(m["content"].get("data", {}).get("state", {}).get("value"), str)
        ]


def test_the_stacks_button_shows_where_every_rank_stands_while_the_cell_runs(kernel, jobs_root):
    running_cell = kernel.submit("%%distributed --workers 3 --grace 1\n" + STACKS_PROGRAM)
    job = wait_for(
        lambda: only_job(jobs_root) if list(jobs_root.iterdir()) else None, 30, what="the job"
    )
    wait_until_up(Job(job), 3)
    widget = WidgetInBrowser(kernel)
    widget.click("Stacks")
    shown = wait_for(
        lambda: [v for v in widget.values() if "load_batch" in v], 30, what="the stacks shown"
    )
    assert "rank 1: train.py:6 in load_batch  time.sleep(300)" in html.unescape(shown[0])
    assert "ranks 0, 2: train.py:4 in wait_for_peers" in html.unescape(shown[0])
    assert job.read_state().state == "running"
    widget.click("Stop")
    wait_for(lambda: job.read_state().state == "stopped", 15, what="the click to stop the job")
    kernel.collect(running_cell, timeout=60)


def test_stop_button_works_while_the_cell_runs_and_run_all_waits(kernel, jobs_root):
    cell = (
        "%%distributed --workers 2 --grace 2\n"
        "import time, jupyter_distrain\n"
        "for step in range(600):\n"
        "    jupyter_distrain.report(step=step, images=1)\n"
        "    time.sleep(0.1)\n"
    )
    running_cell = kernel.submit(cell)
    queued_cell = kernel.submit("print('next cell ran')")  # like "Run All"
    job = wait_for(
        lambda: only_job(jobs_root) if list(jobs_root.iterdir()) else None, 30, what="the job"
    )
    wait_for(lambda: job.read_state().state == "running", 30, what="running")
    widget = WidgetInBrowser(kernel)
    time.sleep(1.0)
    assert job.read_state().state == "running"
    widget.click("Stop")
    wait_for(lambda: job.read_state().state == "stopped", 15, what="the click to stop the job")
    kernel.collect(running_cell, timeout=60)
    nxt = kernel.collect(queued_cell, timeout=60)
    assert "next cell ran" in nxt.stdout


CRASH_ONCE = """
import os, pathlib
class Crash(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        mark = pathlib.Path(os.environ["JUPYTER_DISTRAIN_JOB_DIR"], "checkpoints", "crashed")
        if epoch == 3 and hvd.rank() == 1 and not mark.exists():
            mark.write_text("once")
            os._exit(1)
"""


@pytest.mark.horovod
def test_a_keras_job_restarted_after_a_crash_resumes_at_the_epoch_after_its_backup(jobs_root):
    """``--max-restarts 1 --checkpoint-every 1``: Keras ``fit`` backs up at every epoch's
    end; rank 1 dies as epoch 3 begins; the restarted job resumes at epoch 3, not 0."""
    code = "EPOCHS, EPOCH_PAUSE = 5, 0.1\n" + KERAS_FIT.replace(
        "import time\nmodel.fit(", CRASH_ONCE + "import time\nmodel.fit("
    ).replace("Say()]", "Say(), Crash()]")
    spec = JobSpec(code=code, workers=2, max_restarts=1, checkpoint_every="1", grace=2)
    job = submit(spec)
    assert job.wait(timeout=300) == "succeeded", job.status().error
    assert job.status().restarts == 1
    epochs = re.findall(r"^epoch (\d) size 2$", job.logs(ProcessId("worker", 0)), re.M)
    first = epochs.index("3")  # the first generation got to epoch 3
    assert epochs[:first] == ["0", "1", "2"] and epochs[first + 1 :][-2:] == ["3", "4"], epochs
    assert epochs.count("0") == 1  # the second did not start over
    assert "finished" in job.logs(ProcessId("worker", 0))


@pytest.mark.horovod
def test_scaling_a_keras_job_restarts_it_from_its_checkpoint(jobs_root):
    job = submit(JobSpec(code="EPOCHS, EPOCH_PAUSE = 8, 1.0\n" + KERAS_FIT, workers=2, grace=3))
    log0 = job.dir.log_file(ProcessId("worker", 0))
    wait_for(lambda: log0.exists() and "epoch 1 size 2" in log0.read_text(), 120, what="epoch 1")
    job.scale(3)
    assert job.wait(timeout=300) == "succeeded"
    text = log0.read_text()
    before = [int(e) for e in re.findall(r"^epoch (\d+) size 2$", text, re.M)]
    after = [int(e) for e in re.findall(r"^epoch (\d+) size 3$", text, re.M)]
    assert after, text[-2000:]
    assert after[0] == before[-1] + 1  # resumed after the last epoch checkpointed
    assert after[-1] == 7
    assert "epoch" in job.dir.log_file(ProcessId("worker", 2)).read_text()
    status = job.status()
    assert status.generation == 1 and status.workers == 3
    assert [p.state for p in status.processes] == ["exited"] * 3
    kinds = [e["event"] for e in job.dir.read_events()]
    assert "scale_requested" in kinds and "restart" in kinds


ELASTIC = """\
import os
import time
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
# Horovod's elastic state calls optimizer.variables(): a legacy optimizer's method
optimizer = tf.keras.optimizers.legacy.SGD(0.01)
state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0, sizes=[])


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
        if not state.sizes or state.sizes[-1] != hvd.size():
            state.sizes.append(hvd.size())
            print(f"rank {hvd.rank()} size {hvd.size()} pid {os.getpid()} step {state.step}",
                  flush=True)
        state.step += 1
        time.sleep(0.05)
        state.commit()


train(state)
print(f"done rank {hvd.rank()} size {hvd.size()} pid {os.getpid()}", flush=True)
"""


@pytest.mark.horovod
def test_elastic_horovod_scales_without_restarting_running_ranks(jobs_root):
    job = submit(JobSpec(code="STEPS = 400\n" + ELASTIC, workers=2, grace=3))
    wait_for(lambda: job.state == "running", 60, what="running")
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in range(2)]
    wait_for(
        lambda: all(p.exists() and "size 2" in p.read_text() for p in logs),
        120,
        what="training at size 2",
    )
    pids_before = {p.index: p.pid for p in job.status().processes}
    job.scale(3)
    assert job.wait(timeout=300) == "succeeded", job.logs()[-3000:]
    procs = {p.index: p for p in job.status().processes}
    assert procs[0].pid == pids_before[0] and procs[1].pid == pids_before[1]
    assert len(procs) == 3 and procs[2].pid not in pids_before.values()
    for i in range(3):
        log = job.dir.log_file(ProcessId("worker", i)).read_text()
        assert re.search(r"^done rank \d size 3 pid \d+$", log, re.M), log[-2000:]
    text0 = logs[0].read_text()
    assert f"pid {pids_before[0]}" in text0 and "size 3" in text0
    assert any(e["event"] == "scaled_in_place" for e in job.dir.read_events())
