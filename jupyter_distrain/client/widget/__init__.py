"""The live view of a job: an ipywidgets dashboard in notebooks, a text summary in terminals.

Both are built from the job store alone (state.json, metrics.jsonl, logs/), so a view
made by ``%distributed attach`` shows the whole history. ``refresh`` is cheap to call
often: it reads only what was appended since the last call and redraws at most
``MAX_REDRAWS_PER_SECOND`` times a second.

:mod:`.model` computes what is shown, :mod:`.render` turns it into HTML and SVG,
:mod:`.view` is the widget (and picks the view), :mod:`.text` the summary line and the
terminal's view, :mod:`.frontend` the live text where a front-end draws no widgets.
"""

from ...contract.status import aggregate_images_per_sec
from .model import (
    JobModel,
    gpu_text,
    launch_progress,
    progress,
    stragglers,
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
    "time_to_first_step",
]
