"""The live view of a job: an ipywidgets dashboard in notebooks, a text summary in terminals.

Both are built from the job store alone (state.json, metrics.jsonl, logs/),
so a view made by ``%distributed attach`` shows the whole history. ``refresh``
is cheap to call often: it reads only what was appended since the last call
and redraws at most ``MAX_REDRAWS_PER_SECOND`` times a second.
"""

from __future__ import annotations

import contextlib
import html
import json
import statistics
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import traitlets
from IPython import get_ipython
from IPython.display import display

from ..contract.process import ProcessId, metric_number
from ..contract.store import FINAL_STATES, JobStatus, ProcessRecord, aggregate_images_per_sec
from ..contract.tail import LineReader, last_lines
from .follow import follow
from .job import Job, JobFailed

MAX_REDRAWS_PER_SECOND = 4
STRAGGLER_WINDOW = 20  # steps
STRAGGLER_GAP = 0.20  # below the median by more than this
CHART_POINTS = 300  # per worker, most recent
STATE_COLOURS = {
    "pending": "#888",
    "launching": "#c80",
    "starting": "#c80",
    "running": "#080",
    "succeeded": "#06c",
    "exited": "#06c",
    "stopped": "#666",
    "killed": "#a00",
    "failed": "#a00",
}
LINE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def stragglers(recent: Mapping[str, Sequence[float]], running: Collection[str]) -> list[str]:
    """The running processes whose median images/sec over their recent steps is more than
    ``STRAGGLER_GAP`` below the median of those medians (``recent`` by process label)."""
    medians = {k: statistics.median(v) for k, v in recent.items() if v and k in running}
    if len(medians) < 2:
        return []
    overall = statistics.median(medians.values())
    return sorted(k for k, v in medians.items() if v < (1 - STRAGGLER_GAP) * overall)


def progress(
    steps: Iterable[int | None],
    total_steps: int | None,
    first_step_time: float | None,
    now: float,
) -> tuple[float, float | None]:
    """Fraction done (the furthest process's step over the total) and seconds left
    (from the time since the first step), when the number of steps is known."""
    reached = [s for s in steps if s]
    if not total_steps or not reached:
        return 0.0, None
    done = min(max(reached) / total_steps, 1.0)
    elapsed = now - (first_step_time or now)
    eta = elapsed * (1 - done) / done if done > 0 else None
    return done, eta


def gpu_text(record: ProcessRecord) -> str:
    """A row's GPU cell: utilisation and memory of its devices; "" when not sampled."""
    if record.gpu_percent is None:
        return ""
    return f"{record.gpu_percent:.0f}% {(record.gpu_memory or 0) / 2**30:.1f} GiB"


def launch_progress(processes: Sequence[ProcessRecord]) -> str:
    """How many processes are up, e.g. ``"1/2 processes up"``."""
    up = sum(p.state == "running" for p in processes)
    return f"{up}/{len(processes)} processes up"


def time_to_first_step(first_step_time: float | None, created: float | None) -> float | None:
    """Seconds from the job's creation to its first training step, once there is one."""
    if first_step_time is None or created is None:
        return None
    return first_step_time - created


class JobModel:
    """What the views show, computed from the store; independent of any UI."""

    def __init__(self, job: Job):
        self.job = job
        self.metrics = LineReader(job.dir.metrics_file)
        self.series: dict[str, deque[tuple[int, float]]] = defaultdict(
            lambda: deque(maxlen=CHART_POINTS)
        )
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=STRAGGLER_WINDOW))
        self.first_step_time: float | None = None
        self.total_steps: int | None = None
        self.status = JobStatus()

    def update(self, status: JobStatus | None = None) -> None:
        """Take the job's status (read now unless given) and the metrics added since."""
        self.status = self.job.status() if status is None else status
        while True:  # piece by piece: attaching to a long job never holds all its metrics
            for line in self.metrics.read():
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict):
                    self._add(record)
            if not self.metrics.behind:
                return

    def _add(self, record: dict[str, Any]) -> None:
        process, step = ProcessId.of(record), metric_number(record.get("step"))
        if step is None or process is None:
            return
        if self.first_step_time is None:
            self.first_step_time = metric_number(record.get("time"))
        total = metric_number(record.get("total_steps"))
        if total:
            self.total_steps = int(total)
        ips = metric_number(record.get("images_per_sec"))
        if ips is not None:
            self.series[str(process)].append((step, ips))
            self.recent[str(process)].append(ips)

    # --- derived facts -------------------------------------------------------
    def processes(self) -> list[ProcessRecord]:
        return self.status.processes

    def launch_progress(self) -> str:
        return launch_progress(self.processes())

    def time_to_first_step(self) -> float | None:
        return time_to_first_step(self.first_step_time, self.status.created)

    def aggregate_images_per_sec(self) -> float:
        return aggregate_images_per_sec(self.processes())

    def stragglers(self) -> list[str]:
        """Workers more than 20% below the median images/sec over the last 20 steps."""
        running = {str(p.id) for p in self.processes() if p.state == "running"}
        return stragglers(self.recent, running)

    def progress(self) -> tuple[float, float | None]:
        """Fraction done and seconds left, when the number of steps is known."""
        steps = (p.step for p in self.processes())
        return progress(steps, self.total_steps, self.first_step_time, time.time())


def _process_of(row: dict[str, Any]) -> ProcessId:
    """A row's process (the row's ``rank`` column shows the process's index)."""
    return ProcessId(row["role"], row["rank"])


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


class JobWidget(widgets.VBox):
    """One row per process, the job's images/sec, a chart, progress, and controls."""

    job_state = traitlets.Unicode("pending")
    rows = traitlets.List()
    aggregate_images_per_sec = traitlets.Float(0.0)
    stragglers = traitlets.List()
    launch_progress = traitlets.Unicode("")
    time_to_first_step = traitlets.Float(None, allow_none=True)
    redraws = traitlets.Int(0)

    def __init__(self, job: Job, **kwargs: Any):
        self.job = job
        self.model = JobModel(job)
        self._last_draw = 0.0
        self.display_handle: Any = None  # set by make_view; the final snapshot goes there
        self._snapshot_state = ""
        self.header = widgets.HTML()
        self.table = widgets.HTML()
        self.chart = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0.0, max=1.0, layout={"width": "60%"})
        self.eta = widgets.Label()
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop")
        self.minus_button = widgets.Button(description="-", tooltip="one worker fewer")
        self.plus_button = widgets.Button(description="+", tooltip="one worker more")
        self.logs_button = widgets.ToggleButton(description="Logs", icon="file-text")
        self.rank_picker = widgets.Dropdown(description="process", options=[])
        self.log_view = widgets.HTML(layout={"display": "none"})
        self.message = widgets.Label()
        self.stop_button.on_click(lambda _: self._act(self.job.stop, wait=False))
        self.minus_button.on_click(lambda _: self._scale(-1))
        self.plus_button.on_click(lambda _: self._scale(+1))
        self.logs_button.observe(lambda _: self.refresh(force=True), "value")
        self.rank_picker.observe(lambda _: self.refresh(force=True), "value")
        controls = widgets.HBox(
            [
                self.stop_button,
                self.minus_button,
                self.plus_button,
                self.logs_button,
                self.rank_picker,
            ]
        )
        super().__init__(
            [
                self.header,
                self.table,
                self.chart,
                widgets.HBox([self.bar, self.eta]),
                controls,
                self.message,
                self.log_view,
            ],
            **kwargs,
        )
        self.refresh(force=True)

    # --- actions -----------------------------------------------------------------
    def _act(self, action: Any, **kwargs: Any) -> None:
        try:
            action(**kwargs)
        except Exception as exc:  # shown, never raised into the event loop
            self.message.value = f"{type(exc).__name__}: {exc}"

    def _scale(self, delta: int) -> None:
        workers = (self.model.status.workers or 1) + delta
        if workers < 1:
            self.message.value = "a job needs at least one worker"
            return
        self.message.value = f"scaling to {workers} workers {self.job.scaling_mode}..."
        self._act(self.job.scale, workers=workers)

    # --- drawing -------------------------------------------------------------------
    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
        """Redraw from the store (``status`` when given, else read now), at most
        ``MAX_REDRAWS_PER_SECOND`` times a second unless ``force``."""
        now = time.monotonic()
        if not force and now - self._last_draw < 1 / MAX_REDRAWS_PER_SECOND:
            return
        self._last_draw = now
        self.model.update(status)
        m = self.model
        self.job_state = m.status.state
        self.rows = [self._row(p) for p in m.processes()]
        self.aggregate_images_per_sec = m.aggregate_images_per_sec()
        self.stragglers = m.stragglers()
        self.launch_progress = m.launch_progress()
        self.time_to_first_step = m.time_to_first_step()
        self._draw()
        self.redraws += 1
        if self.job_state in FINAL_STATES and self._snapshot_state != self.job_state:
            self._snapshot_state = self.job_state
            if self.display_handle is not None:  # the output keeps the final dashboard
                self.display_handle.update(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """The widget's view, with a static HTML snapshot of the dashboard beside it:
        what a notebook viewer without a kernel (a code host, nbviewer) shows."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/html"] = self.snapshot_html()
        return bundle

    def snapshot_html(self) -> str:
        """The dashboard as last drawn, as plain HTML: header, table, chart and progress."""
        return (
            "<div class='jupyter-distrain-snapshot'>"
            f"<div>{self.header.value}</div>{self.table.value}{self.chart.value}"
            f"<div>progress {self.bar.value:.0%} &middot; <small>a snapshot of the job's widget "
            f"(the live widget needs a running kernel)</small></div></div>"
        )

    @staticmethod
    def _row(p: ProcessRecord) -> dict[str, Any]:
        heartbeat = p.heartbeat
        return {
            "role": p.role,
            "rank": p.index,
            "host": p.host,
            "pid": p.pid,
            "state": p.state,
            "step": p.step,
            "images_per_sec": p.images_per_sec,
            "loss": p.loss,
            "since_heartbeat": None if heartbeat is None else max(0.0, time.time() - heartbeat),
            "gpu": gpu_text(p),
        }

    def _draw(self) -> None:
        state = self.job_state
        colour = STATE_COLOURS.get(state, "#000")
        parts = [
            f"<b>{html.escape(self.job.id)}</b>",
            f"<span style='color:{colour};font-weight:bold'>{html.escape(state)}</span>",
        ]
        if state == "launching":
            parts.append(self.launch_progress)
        if self.time_to_first_step is not None:
            parts.append(f"first step after {self.time_to_first_step:.1f} s")
        if state in FINAL_STATES:  # nothing is live: the workers' last rates
            last = sum(r["images_per_sec"] or 0.0 for r in self.rows if r["role"] == "worker")
            parts.append(f"<b>{last:,.0f}</b> images/sec at the end")
        else:
            parts.append(f"<b>{self.aggregate_images_per_sec:,.0f}</b> images/sec")
        if self.stragglers:
            parts.append(
                "<span style='color:#a00'>straggling: "
                + html.escape(", ".join(self.stragglers))
                + "</span>"
            )
        if self.model.status.warnings:
            warning = html.escape(self.model.status.warnings[-1])
            parts.append(f"<span style='color:#b60'>{warning}</span>")
        error = self.model.status.error
        if error:
            parts.append(f"<span style='color:#a00'>{html.escape(error)}</span>")
        notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in self.job.notes)
        self.header.value = " &middot; ".join(parts) + notes  # e.g. the hosts checked
        self.table.value = self._table_html()
        self.chart.value = self._chart_svg()
        done, eta = self.model.progress()
        self.bar.value = done
        self.eta.value = f"{done:.0%}" + (f", ETA {eta:.0f} s" if eta is not None else "")
        finished = state in FINAL_STATES
        for button in (self.stop_button, self.minus_button, self.plus_button):
            button.disabled = finished
        labels = [str(_process_of(r)) for r in self.rows]
        if list(self.rank_picker.options) != labels:
            self.rank_picker.options = labels
        self.log_view.layout.display = "block" if self.logs_button.value else "none"
        if self.logs_button.value and self.rank_picker.value:
            self.log_view.value = self._log_tail(self.rank_picker.value)

    def _table_html(self) -> str:
        head = ("role", "rank", "host", "pid", "state", "step", "images/sec", "loss", "heartbeat")
        gpus = any(r.get("gpu") for r in self.rows)  # a column only where there are GPUs
        head += ("gpu",) if gpus else ()
        out = ["<table style='border-collapse:collapse;font-family:monospace'><tr>"]
        out += [f"<th style='padding:0 8px;text-align:left'>{h}</th>" for h in head]
        out.append("</tr>")
        for r in self.rows:
            style = "background:#fdd" if str(_process_of(r)) in self.stragglers else ""
            colour = STATE_COLOURS.get(r["state"], "#000")
            cells = [
                html.escape(str(r["role"])),
                r["rank"],
                html.escape(str(r["host"] or "-")),
                r["pid"] or "-",
                f"<span style='color:{colour}'>{html.escape(str(r['state']))}</span>",
                _fmt(r["step"]),
                _fmt(r["images_per_sec"], ",.0f"),
                _fmt(r["loss"], ".4f"),
                "-" if r["since_heartbeat"] is None else f"{r['since_heartbeat']:.0f} s ago",
            ]
            cells += [html.escape(r.get("gpu") or "-")] if gpus else []
            out.append(f"<tr style='{style}'>")
            out += [f"<td style='padding:0 8px'>{c}</td>" for c in cells]
            out.append("</tr>")
        out.append("</table>")
        return "".join(out)

    def _chart_svg(self, width: int = 520, height: int = 140) -> str:
        series = {k: list(v) for k, v in sorted(self.model.series.items()) if v}
        if not series:
            return ""
        xs = [s for pts in series.values() for s, _ in pts]
        ys = [y for pts in series.values() for _, y in pts]
        x0, x1 = min(xs), max(max(xs), min(xs) + 1)
        y1 = max(ys) * 1.1 or 1.0
        lines = []
        for i, (label, pts) in enumerate(series.items()):
            colour = LINE_COLOURS[i % len(LINE_COLOURS)]
            path = " ".join(
                f"{40 + (s - x0) / (x1 - x0) * (width - 50):.1f},"
                f"{height - 20 - y / y1 * (height - 30):.1f}"
                for s, y in pts
            )
            lines.append(
                f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' "
                f"points='{path}'><title>{html.escape(label)}</title></polyline>"
            )
            lines.append(
                f"<text x='{width - 100}' y='{14 + 12 * i}' font-size='10' "
                f"fill='{colour}'>{html.escape(label)}</text>"
            )
        axis = (
            f"<text x='0' y='12' font-size='10'>{y1:,.0f}</text>"
            f"<text x='0' y='{height - 20}' font-size='10'>0</text>"
            f"<text x='40' y='{height - 4}' font-size='10'>step {x0}</text>"
            f"<text x='{width - 60}' y='{height - 4}' font-size='10'>step {x1}</text>"
        )
        return (
            f"<div>images/sec per step</div><svg width='{width}' height='{height}' "
            f"style='border:1px solid #ddd'>{axis}{''.join(lines)}</svg>"
        )

    def _log_tail(self, label: str, lines: int = 40) -> str:
        tail = last_lines(self.job.dir.log_file(ProcessId.parse(label)), lines)
        return f"<pre style='max-height:20em;overflow:auto'>{html.escape(tail)}</pre>"


class TextSummary:
    """The terminal's view: one line every few seconds, and one at the end."""

    def __init__(self, job: Job, every: float = 5.0, out: Any = None):
        self.model = JobModel(job)
        self.every = every
        self.out = out or sys.stdout
        self._last = 0.0
        self._printed_final = False

    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
        """Print a line if ``every`` seconds have passed (or ``force``); the final one once."""
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        self.model.update(status)
        state = self.model.status.state
        if state in FINAL_STATES:
            if self._printed_final:
                return
            self._printed_final = True
        done, eta = self.model.progress()
        steps = [p.step or 0 for p in self.model.processes()]
        print(
            f"[{self.model.job.id}] {state}: {self.model.launch_progress()}, "
            f"step {max(steps, default=0)}"
            + (f"/{self.model.total_steps}" if self.model.total_steps else "")
            + f", {self.model.aggregate_images_per_sec():,.0f} images/sec"
            + (f", ETA {eta:.0f} s" if eta else ""),
            file=self.out,
            flush=True,
        )


def _in_kernel() -> bool:
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(job: Job) -> JobWidget | TextSummary:
    """The job's widget in a notebook (displayed now), a text summary in a terminal."""
    if not _in_kernel():
        return TextSummary(job)
    widget = JobWidget(job)
    widget.display_handle = display(widget, display_id=True)
    return widget


def follow_in_background(job: Job, view: JobWidget | TextSummary) -> None:
    """Keep a --background job's widget live until the job ends."""
    if isinstance(view, TextSummary):
        return

    def watch() -> None:
        with contextlib.suppress(JobFailed):  # the widget shows the failure
            follow(job, view, stream=False, stop_on_interrupt=False)

    threading.Thread(target=watch, name=f"view-{job.id}", daemon=True).start()
