"""The notebook's view of a job: an ipywidgets dashboard (the rows, the job's
images/sec, a chart, progress, and Stop, -/+ and Logs controls), and choosing the
view for where the code runs."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import ipywidgets as widgets
import traitlets
from IPython import get_ipython
from IPython.display import display

from ...contract.process import ProcessId
from ...contract.status import FINAL_STATES, JobStatus
from ...contract.tail import last_lines
from ..follow import follow
from ..job import Job, JobFailed
from . import render
from .frontend import TextFallback
from .model import MAX_ROWS, JobModel, collapsed_rows, collapsed_series, process_of, row_of
from .text import TextSummary, summary_line

MAX_REDRAWS_PER_SECOND = 4


class JobWidget(widgets.VBox):
    """One row per process, the job's images/sec, a chart, progress, and controls."""

    job_state = traitlets.Unicode("pending")
    rows = traitlets.List()
    aggregate_images_per_sec = traitlets.Float(0.0)
    stragglers = traitlets.List()
    launch_progress = traitlets.Unicode("")
    time_to_first_step = traitlets.Float(None, allow_none=True)
    compiled_programs = traitlets.Unicode("")  # "13 of 13 compiled programs reused"
    redraws = traitlets.Int(0)

    def __init__(self, job: Job, from_start: bool = True, **kwargs: Any):
        self.job = job
        self.model = JobModel(job, from_start)
        self._last_draw = 0.0
        self.display_handle: Any = None  # set by make_view; the final snapshot goes there
        self.text_fallback: TextFallback | None = None  # set by keep_text_live
        self._snapshot_state = ""
        self._warning_shown = ""
        self.header = widgets.HTML()
        self.table = widgets.HTML()
        self.chart = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0.0, max=1.0, layout={"width": "60%"})
        self.eta = widgets.Label()
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop")
        self.minus_button = widgets.Button(description="-", tooltip="one worker fewer")
        self.plus_button = widgets.Button(description="+", tooltip="one worker more")
        self.session = job.spec.session is not None  # its size stays as it started
        self.logs_button = widgets.ToggleButton(description="Logs", icon="file-text")
        self.all_rows_button = widgets.ToggleButton(
            description="All rows",
            tooltip="one row for every process (else those that stand out, the rest grouped)",
            layout={"display": "none"},
        )
        self.stacks_button = widgets.Button(
            description="Stacks",
            icon="list",
            tooltip="where every process is now: its stacks",
            layout={"width": "auto"},
        )
        self.stacks_view = widgets.HTML()
        self.process_picker = widgets.Dropdown(description="process", options=[])
        self.log_view = widgets.HTML(layout={"display": "none"})
        self.message = widgets.Label()
        self.stop_button.on_click(lambda _: self._act(self.job.stop, wait=False))
        self.minus_button.on_click(lambda _: self._scale(-1))
        self.plus_button.on_click(lambda _: self._scale(+1))
        self.logs_button.observe(lambda _: self.refresh(force=True), "value")
        self.all_rows_button.observe(lambda _: self.refresh(force=True), "value")
        self.stacks_button.on_click(lambda _: self.show_stacks())
        self.process_picker.observe(lambda _: self.refresh(force=True), "value")
        controls = widgets.HBox(
            [
                self.stop_button,
                self.minus_button,
                self.plus_button,
                self.logs_button,
                self.all_rows_button,
                self.stacks_button,
                self.process_picker,
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
                self.stacks_view,
                self.log_view,
            ],
            **{"_view_count": 0, **kwargs},  # front-ends count their views (frontend.py)
        )
        self.refresh(force=True)

    def keep_text_live(self, lines: bool) -> None:
        """Where no front-end draws this (displayed) widget, keep its display's text
        current, and print progress lines to the cell's stream if ``lines``
        (:class:`~.frontend.TextFallback`). Only for a follow during which the kernel
        handles comm messages (an async cell's, a background thread's): the views are
        counted through them."""
        self.text_fallback = TextFallback(self, lines)

    # --- actions -----------------------------------------------------------------
    def _act(self, action: Any, **kwargs: Any) -> None:
        try:
            action(**kwargs)
        except Exception as exc:  # shown, never raised into the event loop
            self.message.value = f"{type(exc).__name__}: {exc}"

    def show_stacks(self) -> None:
        """Take every live process's stacks and show them, grouped, under the controls."""
        self.message.value = "taking the stacks of every process..."
        try:
            report = self.job.stacks()
        except RuntimeError as exc:
            self.message.value = str(exc)
            return
        self.message.value = ""
        self.stacks_view.value = render.log_html(report.text())

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
        self.rows = [row_of(p) for p in m.processes()]
        self.aggregate_images_per_sec = m.aggregate_images_per_sec()
        self.stragglers = list(m.stragglers())
        self.launch_progress = m.launch_progress()
        self.time_to_first_step = m.time_to_first_step()
        self.compiled_programs = m.compile_cache_text()
        self._draw()
        self.redraws += 1
        if self.text_fallback is not None:
            self.text_fallback.tick()
        if self.job_state in FINAL_STATES and self._snapshot_state != self.job_state:
            self._snapshot_state = self.job_state
            if self.display_handle is not None:  # the output keeps the final dashboard
                self.display_handle.update(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """The widget's view, with a static HTML snapshot of the dashboard beside it
        (what a notebook viewer without a kernel, a code host or nbviewer shows) and
        the job's summary line as its text (what ``jupyter console`` and text exports
        show, instead of the widget's repr)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/html"] = self.snapshot_html()
            bundle["text/plain"] = summary_line(self.model)
        return bundle

    def snapshot_html(self) -> str:
        """The dashboard as last drawn, as plain HTML: header, table, chart and progress."""
        return render.snapshot_html(
            self.header.value, self.table.value, self.chart.value, self.bar.value
        )

    def _draw(self) -> None:
        self.header.value = render.header_html(self.model)
        many = len(self.rows) > MAX_ROWS
        self.all_rows_button.layout.display = "inline-flex" if many else "none"
        shown = self.rows
        if not self.all_rows_button.value:
            shown = collapsed_rows(self.rows, self.stragglers)
        self.table.value = render.table_html(shown, self.stragglers)
        warnings = self.model.status.warnings
        if warnings and "\n" in warnings[-1] and warnings[-1] != self._warning_shown:
            self._warning_shown = warnings[-1]  # a stall's, with every rank's stacks
            self.stacks_view.value = render.log_html(warnings[-1])
        first = [str(process_of(r)) for r in self.rows[:1]]
        lines = collapsed_series(self.model.series, [*self.stragglers, *first])
        self.chart.value = render.chart_svg(lines)
        done, eta = self.model.progress()
        self.bar.value = done
        self.eta.value = f"{done:.0%}" + (f", ETA {eta:.0f} s" if eta is not None else "")
        for button in (self.stop_button, self.minus_button, self.plus_button, self.stacks_button):
            button.disabled = self.job_state in FINAL_STATES
        if self.session:  # a resize would restart the ranks, and their state would go
            self.minus_button.disabled = self.plus_button.disabled = True
        labels = [str(process_of(r)) for r in self.rows]
        if list(self.process_picker.options) != labels:
            self.process_picker.options = labels
        self.log_view.layout.display = "block" if self.logs_button.value else "none"
        if self.logs_button.value and self.process_picker.value:
            tail = last_lines(self.job.dir.log_file(ProcessId.parse(self.process_picker.value)), 40)
            self.log_view.value = render.log_html(tail)


def _in_kernel() -> bool:
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(job: Job, from_start: bool = True) -> JobWidget | TextSummary:
    """The job's widget in a notebook (displayed now), a text summary in a terminal;
    ``from_start``: of the job's metrics from its start, else from now."""
    if not _in_kernel():
        return TextSummary(job, from_start=from_start)
    widget = JobWidget(job, from_start)
    widget.display_handle = display(widget, display_id=True)
    return widget


def follow_in_background(job: Job, view: JobWidget | TextSummary) -> None:
    """Keep a --background job's widget live until the job ends."""
    if isinstance(view, TextSummary):
        return
    view.keep_text_live(lines=False)

    def watch() -> None:
        with contextlib.suppress(JobFailed):  # the widget shows the failure
            follow(job, view, stream=False, stop_on_interrupt=False)

    threading.Thread(target=watch, name=f"view-{job.id}", daemon=True).start()
