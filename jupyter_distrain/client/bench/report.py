"""A bench's results: the rows, the text table, the SVG chart and the saved files."""

from __future__ import annotations

import csv
import dataclasses
import html
import json
from dataclasses import dataclass
from pathlib import Path

from .settings import BenchSettings


@dataclass
class BenchRow:
    """One run: its configuration, throughput and scaling efficiency."""

    backend: str  # "horovod", "tf", "ps async (1 ps)", "ps sync (1 ps)"
    workers: int
    images_per_sec: float
    efficiency: float | None  # throughput at N / (N x throughput at 1)
    job: str
    framework: str = "TensorFlow"  # or "PyTorch", "JAX"


def save(rows: list[BenchRow], settings: BenchSettings, out: Path) -> None:
    """``results.csv``, ``results.json`` (with the settings) and ``chart.svg``."""
    fields = [f.name for f in dataclasses.fields(BenchRow)]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)
    document = {
        "settings": dataclasses.asdict(settings),
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    (out / "results.json").write_text(json.dumps(document, indent=1))
    (out / "chart.svg").write_text(chart_svg(rows))


def table(rows: list[BenchRow]) -> str:
    """The results as a text table, one line per backend and worker count."""
    lines = [f"{'backend':<18}{'framework':<12}{'workers':>8}{'images/sec':>13}{'efficiency':>12}"]
    for r in sorted(rows, key=lambda r: (r.backend, r.workers)):
        efficiency = "-" if r.efficiency is None else f"{r.efficiency:.2f}"
        lines.append(
            f"{r.backend:<18}{r.framework:<12}{r.workers:>8}{r.images_per_sec:>13,.0f}"
            f"{efficiency:>12}"
        )
    return "\n".join(lines)


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def chart_svg(rows: list[BenchRow], width: int = 480, height: int = 280) -> str:
    """Images/sec against workers, one line per backend, as a standalone SVG."""
    left, bottom, top, right = 60, 40, 20, 120
    top_rate = max((r.images_per_sec for r in rows), default=1.0) or 1.0
    most = max((r.workers for r in rows), default=1)

    def point(r: BenchRow) -> str:
        x = left + (r.workers - 1) / max(1, most - 1) * (width - left - right)
        y = height - bottom - r.images_per_sec / top_rate * (height - top - bottom)
        return f"{x:.1f},{y:.1f}"

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='sans-serif' font-size='11'>",
        f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' "
        "stroke='#444'/>",
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#444'/>",
        f"<text x='{left}' y='{height - 8}'>workers (1..{most})</text>",
        f"<text x='4' y='{top + 4}'>{top_rate:,.0f}</text>",
        f"<text x='4' y='{height - bottom}'>0</text>",
        f"<text x='4' y='{top + 18}'>img/s</text>",
    ]
    names = sorted({r.backend for r in rows})
    for i, name in enumerate(names):
        colour = _COLOURS[i % len(_COLOURS)]
        line = sorted((r for r in rows if r.backend == name), key=lambda r: r.workers)
        points = " ".join(point(r) for r in line)
        parts.append(
            f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{points}'/>"
        )
        parts += [
            f"<circle cx='{point(r).split(',')[0]}' cy='{point(r).split(',')[1]}' r='3' "
            f"fill='{colour}'/>"
            for r in line
        ]
        parts.append(
            f"<text x='{width - right + 8}' y='{top + 14 * (i + 1)}' fill='{colour}'>"
            f"{html.escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
