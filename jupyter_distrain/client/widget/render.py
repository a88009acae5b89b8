"""The job's dashboard as HTML and SVG: the header, the table of processes, the
images/sec chart and a log's tail.

Everything shown comes from the job store, and the store holds what the job's
processes and hosts reported (a host name, a pid, a role), so every value is escaped
here, where it is put into markup, whatever its type.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .model import JobModel, process_of, stragglers_text

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
TABLE_HEAD = ("role", "index", "host", "pid", "state", "step", "images/sec", "loss", "heartbeat")


def _text(value: Any, spec: str = "", missing: str = "-") -> str:
    """``value`` formatted with ``spec`` (as it is when it is not a number), escaped;
    ``missing`` for None or "" (a row from an untrusted report may hold anything)."""
    if value is None or value == "":
        return missing
    try:
        shown = format(value, spec)
    except (TypeError, ValueError):
        shown = str(value)
    return html.escape(shown)


def _coloured(state: Any) -> str:
    colour = STATE_COLOURS.get(state, "#000") if isinstance(state, str) else "#000"
    return f"<span style='color:{colour}'>{_text(state)}</span>"


def header_html(model: JobModel) -> str:
    """The job's id and state, launch progress, the first step's time, compiled programs
    reused, images/sec, stragglers, the last warning, the error and the job's notes (e.g.
    the hosts checked)."""
    status, job = model.status, model.job
    state = status.state
    colour = STATE_COLOURS.get(state, "#000")
    parts = [
        f"<b>{html.escape(job.id)}</b>",
        f"<span style='color:{colour};font-weight:bold'>{html.escape(state)}</span>",
    ]
    if state == "launching":
        parts.append(html.escape(model.launch_progress()))
    first_step = model.time_to_first_step()
    if first_step is not None:
        parts.append(f"first step after {first_step:.1f} s")
    compiled = model.compile_cache_text()
    if compiled:
        parts.append(html.escape(compiled))
    rate, what = model.rate()
    parts.append(f"<b>{rate:,.0f}</b> {what}")
    slow = model.stragglers()
    if slow:
        straggling = html.escape(f"straggling: {stragglers_text(slow)} (Stacks shows where)")
        parts.append(f"<span style='color:#a00'>{straggling}</span>")
    if status.warnings:  # its first line: a stall's stacks show below the controls
        last = status.warnings[-1].splitlines()[0]
        parts.append(f"<span style='color:#b60'>{html.escape(last)}</span>")
    if status.error:
        parts.append(f"<span style='color:#a00'>{html.escape(status.error)}</span>")
    notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in job.notes)
    return " &middot; ".join(parts) + notes


def table_html(rows: Sequence[Mapping[str, Any]], stragglers: Collection[str]) -> str:
    """One row per process, or per group of processes (``model.collapsed_rows``: said in
    the caption); a gpu column only where some process has GPUs."""
    gpus = any(r.get("gpu") for r in rows)
    head = TABLE_HEAD + (("gpu",) if gpus else ())
    out = ["<table style='border-collapse:collapse;font-family:monospace'>"]
    grouped = sum(r.get("group", 0) for r in rows)
    if grouped:
        processes = grouped + sum("group" not in r for r in rows)
        out.append(
            "<caption style='text-align:left'><small>"
            f"{processes} processes: {grouped} that do not stand out are grouped "
            "(images/sec summed, step and heartbeat their range); All rows shows each"
            "</small></caption>"
        )
    out.append("<tr>")
    out += [f"<th style='padding:0 8px;text-align:left'>{h}</th>" for h in head]
    out.append("</tr>")
    for r in rows:
        if "group" in r:
            style = "color:#555;font-style:italic"
        else:
            style = "background:#fdd" if str(process_of(dict(r))) in stragglers else ""
        heartbeat = r["since_heartbeat"]
        cells = [
            _text(r["role"]),
            _text(r["index"]),
            _text(r["host"]),
            _text(r["pid"]),
            _coloured(r["state"]),
            _text(r["step"]),
            _text(r["images_per_sec"], ",.0f"),
            _text(r["loss"], ".4f"),
            "-" if heartbeat is None else f"{_text(heartbeat, '.0f')} s ago",
        ]
        cells += [_text(r.get("gpu"))] if gpus else []
        out.append(f"<tr style='{style}'>")
        out += [f"<td style='padding:0 8px'>{c}</td>" for c in cells]
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def chart_svg(
    series: Mapping[str, Sequence[tuple[int, float]]], width: int = 520, height: int = 140
) -> str:
    """Images/sec against step, one line per process (``series`` by process label)."""
    series = {k: list(v) for k, v in sorted(series.items()) if v}
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


def log_html(text: str) -> str:
    """A log's tail, as preformatted text in a scrolling box."""
    return f"<pre style='max-height:20em;overflow:auto'>{html.escape(text)}</pre>"


def snapshot_html(header: str, table: str, chart: str, done: float) -> str:
    """The dashboard as plain HTML (what a notebook viewer without a kernel shows)."""
    return (
        "<div class='jupyter-distrain-snapshot'>"
        f"<div>{header}</div>{table}{chart}"
        f"<div>progress {done:.0%} &middot; <small>a snapshot of the job's widget "
        f"(the live widget needs a running kernel)</small></div></div>"
    )
