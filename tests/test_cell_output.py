"""What a cell prints of its processes' output: Keras progress bars as their last
state, TensorFlow's start-up lines once, everything on disk as written."""

from __future__ import annotations

import io

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.client.follow import follow
from jupyter_distrain.client.output import CellOutput, as_terminal_shows
from jupyter_distrain.contract.process import ProcessId

# what Keras 2's Progbar writes for one epoch of 3 steps (backspaces, then \r, padding)
BAR = (
    "\r1/3 [=========>....................] - ETA: 0s - loss: 2.3000"
    + "\b" * 62
    + "\r2/3 [===================>..........] - ETA: 0s - loss: 2.1000"
    + "\b" * 62
    + "\r3/3 [==============================] - 1s 5ms/step - loss: 2.0000"
)


def test_a_progress_bar_shows_its_last_state():
    assert as_terminal_shows(BAR) == (
        "3/3 [==============================] - 1s 5ms/step - loss: 2.0000"
    )
    assert as_terminal_shows("abc\rxy") == "xyc"
    assert as_terminal_shows("\x1b[1m10/10\x1b[0m\r\x1b[1m11/11\x1b[0m") == "11/11"
    assert as_terminal_shows("plain text") == "plain text"


def test_tensorflow_startup_lines_show_once_user_lines_always():
    out = CellOutput()
    tf_line = "2026-11-29 23:09:42.{}: I tensorflow/core/util/port.cc:113] oneDNN custom ops on."
    absl = "W{} 23:09:4{}.123456   {} cuda_executor.cc:1] no GPU"
    shown = [
        out.lines(tf_line.format("111111")),
        out.lines(tf_line.format("222222")),  # the other rank, another time
        out.lines(absl.format("1129", 1, 100)),
        out.lines(absl.format("1129", 2, 200)),
        out.lines("epoch 1 done"),
        out.lines("epoch 1 done"),  # the user's own lines are never dropped
        out.lines("\r\b\r"),
        out.lines(""),
    ]
    assert shown == [
        [tf_line.format("111111")],
        [],
        [absl.format("1129", 1, 100)],
        [],
        ["epoch 1 done"],
        ["epoch 1 done"],
        [],
        [""],
    ]
    assert CellOutput(all_output=True).lines(BAR) == [BAR]
    # TensorFlow 2.20's absl lines before InitializeLog: seconds since the epoch
    new_absl = "I0000 00:00:1796001486.{}   {} grpc_server_lib.cc:466] Started server"
    assert out.lines(new_absl.format("918220", 17766)) == [new_absl.format("918220", 17766)]
    assert out.lines(new_absl.format("919325", 17768)) == []
    # PyTorch's c10 logging, the same warning from both ranks of a torch job
    c10d = "[W1202 01:30:49.{} socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3"
    assert out.lines(c10d.format("039325526")) == [c10d.format("039325526")]
    assert out.lines(c10d.format("278947119")) == []


def test_a_warning_written_into_a_bar_becomes_its_own_line_once():
    out = CellOutput()
    glued = "\r 7/12 [====>....] - ETA: 0s - loss: 1.9WARNING:tensorflow:eager is slow"
    assert out.lines(glued) == ["WARNING:tensorflow:eager is slow"]
    assert out.lines(glued) == []  # the next epoch, or the other rank: shown already
    padded = "\r 9/12 [=====>...] - loss: 5.1 WARNING:tensorflow:eager is slow"
    assert out.lines(padded) == []  # after the bar's padding: the same message
    last_eta = "\r12/12 [==========] - ETA: 0s - loss: 7.2WARNING:tensorflow:eager is slow"
    assert out.lines(last_eta) == []  # the last step's ETA state: its final state follows
    cpp = "\r 7/12 [===>...] - loss: 2.1e-052026-11-30 01:18:07.924873: I tf/x.cc:407] Local rendezvous"
    assert out.lines(cpp) == ["2026-11-30 01:18:07.924873: I tf/x.cc:407] Local rendezvous"]
    final = "\r12/12 [==========] - 1s 14ms/step - loss: 0.6WARNING:tensorflow:other"
    assert out.lines(final) == [
        "12/12 [==========] - 1s 14ms/step - loss: 0.6",
        "WARNING:tensorflow:other",
    ]


KERAS_FIT = """\
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((96, 4)), np.ones((96, 1)), batch_size=8, epochs=3, verbose=1)
"""


def test_a_two_worker_keras_fit_prints_readable_lines(jobs_root):
    job = submit(JobSpec(code=KERAS_FIT, workers=2, backend="tf"))
    out = io.StringIO()
    assert follow(job, out=out, timeout=180) == "succeeded"
    text = out.getvalue()
    assert "\r" not in text and "\b" not in text
    for rank in (0, 1):
        finals = [x for x in text.splitlines() if x.startswith(f"[{rank}] ") and "/step" in x]
        assert len(finals) == 3, text  # one line per epoch, its bar's last state
    startup = [x for x in text.splitlines() if "cpu_feature_guard" in x]
    assert len(startup) <= 1, startup  # both ranks log it; it shows once
    # the logs on disk keep every byte
    raw = job.dir.log_file(ProcessId("worker", 1)).read_bytes()
    assert b"\b" in raw and raw.count(b"loss:") > 3
