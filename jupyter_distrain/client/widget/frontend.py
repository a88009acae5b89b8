"""Whether a front-end draws the job's widget, and live text for those that do not.

A widget front-end (JupyterLab, Notebook 7, VS Code's renderer: every one built on
``@jupyter-widgets/base``) counts the views it creates back to the kernel when the
model's ``_view_count`` is a number: +1 when a view is shown, -1 when it is removed. The
widget is displayed with a count of 0. Where no view has been counted
``GRACE_SECONDS`` after the display, nothing draws the widget there (``jupyter
console``, a bare kernel client, nbclient/nbconvert, a front-end whose widgets do not
render), and :class:`TextFallback` keeps the display's text current instead: the
display is updated (``update_display_data``: its ``text/plain`` is the job's summary
line) every ``UPDATE_SECONDS``, and, where the cell's stream is asked for (a cell that
waits for its job), a summary line is printed on each change of state and every
``LINE_SECONDS``, because ``jupyter console`` shows no display updates. A front-end that
draws the widget gets no periodic update: updating a display re-creates its view.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ...contract.status import FINAL_STATES
from ..job import Job
from .model import JobModel
from .text import SummaryLines

log = logging.getLogger(__name__)

GRACE_SECONDS = 2.0  # a widget front-end has counted its view by then
UPDATE_SECONDS = 3.0  # how often the display's text is updated where no view is drawn
LINE_SECONDS = 15.0  # how often a progress line is printed there (and on each new state)


class Displayed(Protocol):
    """What the fallback reads of the widget (:class:`~.view.JobWidget`)."""

    job: Job
    model: JobModel  # as of the widget's last redraw
    display_handle: Any  # IPython's DisplayHandle, or None
    _view_count: int | None  # ipywidgets' trait: the views front-ends counted


class TextFallback:
    """The live text of a displayed :class:`~.view.JobWidget` where no front-end draws it.

    ``widget`` must have been displayed with ``_view_count`` 0 and carry its
    ``display_handle``; :meth:`tick` is called after each redraw, from the thread that
    follows the job. ``lines``: print progress lines to the cell's stream (only a cell
    that waits for its job: a background job's lines would land in later output).
    """

    def __init__(self, widget: Displayed, lines: bool):
        self.widget = widget
        self.lines = SummaryLines(LINE_SECONDS) if lines else None
        self.since = time.monotonic()
        self.drawn = False  # a view was counted: a widget front-end, for good
        self._updated = 0.0

    def active(self) -> bool:
        """Whether the display is followed as text: no view counted within the grace."""
        if self.drawn:
            return False
        if self.widget._view_count:
            self.drawn = True
            log.debug("job %s: a front-end draws the widget", self.widget.job.id)
            return False
        return time.monotonic() - self.since >= GRACE_SECONDS

    def tick(self) -> None:
        """Update the display's text and print a progress line where they are due (the
        widget's own final update covers the end)."""
        if not self.active():
            return
        model, handle, now = self.widget.model, self.widget.display_handle, time.monotonic()
        state = model.status.state
        due = now - self._updated >= UPDATE_SECONDS
        if due and state not in FINAL_STATES and handle is not None:
            self._updated = now
            handle.update(self.widget)
        if self.lines is not None and self.lines.due(state):
            self.lines.write(model)
