"""The live view of a job: an ipywidgets dashboard in notebooks, a text summary in terminals.

Both are built from the job store alone (state.json, metrics.jsonl, logs/), so a view
made by ``%distributed attach`` shows the whole history. ``refresh`` is cheap to call
often: it reads only what was appended since the last call and redraws at most
``MAX_REDRAWS_PER_SECOND`` times a second.

:mod:`.model` computes what is shown, :mod:`.render` turns it into HTML and SVG,
:mod:`.view` is the widget (and picks the view), :mod:`.text` the summary line and the
terminal's view, :mod:`.frontend` the live text where a front-end draws no widgets.

Metrics and the widget
----------------------

- **Channel** (`contract/metrics.py`): each process has one ZeroMQ PUSH socket
  (`Reporter`), made on first use; records are buffered and sent every 0.25 s
  or every 512 records as one two-frame message: the records as JSON lines, and
  the HMAC-SHA256 of those bytes under the job's secret. The supervisor's
  `Collector` (PULL; over TCP also a CURVE server keyed by the job's secret, which
  drops peers that have not finished the handshake in 5 s) drops and counts anything
  unsigned or forged
  (`metrics_rejected` in state.json) and appends valid payloads to
  `metrics.jsonl` byte for byte; it parses only the latest step record of each
  batch, to update the process's row (step, images/sec, loss, heartbeat).
  A reporter with nothing to say sends a heartbeat each second. The worker
  closes its reporter (delivering what is buffered) before its `bye`, and the
  supervisor stops the collector only after every process is gone.
- **Keras** (`worker/keras_hook.py`): an import hook wraps
  `keras.src.engine.training.Model.fit` right after Keras loads (TensorFlow is
  never imported by us first). Each `fit` gets a per-step metrics callback
  (images per step from `batch_size`, the dataset's static batch dimension,
  Keras's default 32 for arrays, or `--batch-size`), plus
  `BackupAndRestore(checkpoints/keras-backup)` and a checkpoint-request check.
  Custom loops call `jupyter_distrain.report(...)` or `timed_step(...)`.
  `--env JUPYTER_DISTRAIN_INSTRUMENT=0` switches the Keras instrumentation off.
- **Widget** (`client/widget/`): `JobModel` computes everything from the store
  (state.json + metrics.jsonl read incrementally through `tail.LineReader`), so
  `%distributed attach` rebuilds the whole history. `JobWidget` (ipywidgets 8:
  HTML table, an inline-SVG chart of images/sec per step per worker, a
  progress bar with ETA from Keras's `steps * epochs`, Stop / - / + / Logs)
  redraws at most 4 times a second whatever the message rate; its Logs view
  reads only the end of a log (`tail.last_lines`). Stragglers:
  running processes whose median step time over their last 20 steps is 1.25x the
  median of the others' medians or more (the rules are plain functions in
  `client/widget/model.py`, tested without a job: `tests/test_client_rules.py`).
  Many processes (2026-12-06): past 16 rows the table shows one by one the processes
  that stand out (each role's first, stragglers, a state other than the most common,
  the few of a small role such as the ps) and groups the others, one row per run of
  consecutive processes of a role in one state (index range, step range, images/sec
  summed, oldest heartbeat), said in its caption; *All rows* shows each. Past 8
  processes the chart draws rank 0, the stragglers and the median of the others. At
  128 ranks the table went from 47 KiB of HTML to ~2 KiB, the chart from 128 lines to
  2 (`benchmarks/control_plane.py`). Its traits
  (`rows`, `job_state`,
  `aggregate_images_per_sec`, `stragglers`, ...) are what tests assert on. In a
  terminal IPython a `TextSummary` line is printed every 5 s and on each change of
  state instead.
- **Where no front-end draws the widget** (`client/widget/frontend.py`). The display's
  `text/plain` is the job's summary line, so `jupyter console`, a bare kernel client
  and text exports show that and not a widget's repr. Keeping it current needs display
  updates, but updating a display re-creates the widget's view in JupyterLab (a
  flicker, the Logs view and the picker reset), so a widget front-end must get none
  until the end. The kernel cannot ask which front-end it has; it can count views:
  ipywidgets' `_view_count` (experimental; `None` = not counted), which every front-end
  built on `@jupyter-widgets/base` increments when a view is shown and decrements when it
  is removed. The widget is displayed with a count of 0; if no view was counted 2 s
  after the display, nothing draws it, and from then on the display is updated every
  3 s and, in a cell that waits for its job, a summary line is printed on each change of
  state and every 15 s, because `jupyter console` ignores `update_display_data` (its
  `handle_iopub` shows `display_data` only). Once a view is counted the job is a
  widget's for good: one stray update re-creates the view, which counts, and the
  updates stop. Only where the kernel handles comm messages while the job is followed
  (the async cell, a `--background` job's thread) is this done; a blocking follow
  (`%distributed attach`, `run_cell_magic`) cannot hear the count and keeps the
  display as it was until the end. A job that ends within the grace shows its first
  text, and its final one where display updates are shown (not in `jupyter console`).
  A background job prints no lines: they would land in later cells' output.
- **Buttons while a cell runs.** A kernel handles widget messages on its main
  thread, which a blocking cell holds. jupyter-ui-poll's workaround calls
  `kernel.do_one_iteration()`, which ipykernel 7.4 no longer has. ipykernel
  7.4 does dispatch comm messages while an *async* cell awaits, so in a kernel
  the extension registers an input transformer that turns a `%%distributed`
  cell into one `await ...distributed_async(line, body)`: the wait polls with
  `asyncio.sleep`, buttons work, and the next cell of a "Run All" still waits
  (the cell holds the kernel's execution lock). The transformer is marked
  `has_side_effects`, so IPython's `check_complete` (a kernel's `is_complete`) skips it:
  otherwise the one-line await it makes of the cell was "complete" at the magic's line,
  and `jupyter console` ran a `%%distributed` line without its body. The kernel's
  interrupt cancels the async cell: the job is stopped and the cell ends with
  `KeyboardInterrupt: job X stopped` (`JobInterrupted`). Needs ipykernel >=
  7.4 for live buttons; with an older kernel the job still runs and stops, and
  `--background` keeps the buttons usable.
"""

from ...contract.status import aggregate_images_per_sec
from .model import (
    JobModel,
    gpu_text,
    launch_progress,
    progress,
    stragglers,
    stragglers_text,
    time_to_first_step,
)
from .text import TextSummary
from .view import MAX_REDRAWS_PER_SECOND, JobWidget, follow_in_background, make_view

__all__ = [
    "MAX_REDRAWS_PER_SECOND",
    "JobModel",
    "JobWidget",
    "TextSummary",
    "aggregate_images_per_sec",
    "follow_in_background",
    "gpu_text",
    "launch_progress",
    "make_view",
    "progress",
    "stragglers",
    "stragglers_text",
    "time_to_first_step",
]
