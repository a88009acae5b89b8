"""The control plane at scale: a local ``plain`` job of N ranks that report a metric every
step (a simulation of a large job on this machine: ``JUPYTER_DISTRAIN_LOCAL_PROCESS_LIMIT``
lifts the 4-per-core cap), measured from outside as the notebook sees it:

- time from submit until every rank is running, and until every rank has stepped;
- while it runs (``--seconds``): the supervisor's CPU share and peak resident memory,
  metrics records stored per second, state.json rewrites per second;
- the views with N rows: the widget model's update, the header's HTML, the table's as
  the widget draws it (past 16 rows, those that stand out and the rest grouped) and with
  every row, the chart's SVG (rank 0 and the others' median), each one's time and size;
  the REST model (``server/models.job_model``) size and time, and the job's entry in
  the jobs list the sidebar polls (no process models);
- Stop: its time, the job's processes still there when it returns and 2 s later.

    .venv/bin/python benchmarks/control_plane.py [--ranks 16 64 128] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

RANK_PROGRAM = """\
import time
from jupyter_distrain import report
step = 0
while True:
    step += 1
    report(step=step, images=32, loss=1.0 / step)
    time.sleep({interval})
"""


def timed(fn: Any, repeat: int = 20) -> tuple[float, Any]:
    """The median seconds of ``repeat`` calls of ``fn`` and its last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def wait(condition: Any, seconds: float) -> float:
    """Seconds until ``condition()`` held (raises after ``seconds``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > seconds:
            raise TimeoutError(f"not within {seconds} s")
        time.sleep(0.05)
    return time.monotonic() - start


def measure(ranks: int, seconds: float, interval: float) -> dict[str, Any]:
    """One job of ``ranks`` ranks, started, watched for ``seconds`` and stopped."""
    import psutil
    from jobscan import processes_of

    from jupyter_distrain import JobSpec, submit
    from jupyter_distrain.client.widget import render
    from jupyter_distrain.client.widget.model import (
        JobModel,
        collapsed_rows,
        collapsed_series,
        row_of,
    )
    from jupyter_distrain.contract.process import ProcessId
    from jupyter_distrain.server.models import job_model

    job = submit(
        JobSpec(code=RANK_PROGRAM.format(interval=interval), workers=ranks, backend="plain")
    )
    all_running = wait(
        lambda: sum(p.state == "running" for p in job.status().processes) == ranks or job.done,
        600,
    )
    all_stepped = wait(lambda: all(p.step for p in job.status().processes) or job.done, 600)
    assert not job.done, job.status().error
    supervisor = psutil.Process(job.status().supervisor_pid)
    cpu_before = sum(supervisor.cpu_times()[:2])
    lines_before = len(job.dir.metrics_file.read_bytes().splitlines())
    state_file = job.dir.path / "state.json"
    rewrites, last_inode, peak_rss = 0, None, 0
    window = time.monotonic()
    while time.monotonic() - window < seconds:
        inode = state_file.stat().st_ino  # written atomically: a new inode each time
        rewrites += inode != last_inode
        last_inode = inode
        peak_rss = max(peak_rss, supervisor.memory_info().rss)
        time.sleep(0.02)
    elapsed = time.monotonic() - window
    cpu = sum(supervisor.cpu_times()[:2]) - cpu_before
    records = len(job.dir.metrics_file.read_bytes().splitlines()) - lines_before
    model = JobModel(job)
    first_update, _ = timed(model.update, repeat=1)  # the whole metrics file
    update, _ = timed(model.update)
    header, header_html = timed(lambda: render.header_html(model))
    rows = [row_of(p) for p in model.processes()]
    table, table_html = timed(lambda: render.table_html(collapsed_rows(rows, []), []))
    every_row, every_row_html = timed(lambda: render.table_html(rows, []))
    chart, chart_svg = timed(
        lambda: render.chart_svg(collapsed_series(model.series, [str(ProcessId("worker", 0))]))
    )
    rest, rest_model = timed(lambda: json.dumps(job_model(job)))
    listed = json.dumps(job_model(job, processes=False))  # its entry in the jobs list
    stop_start = time.monotonic()
    state = job.stop()
    stop = time.monotonic() - stop_start
    named = [p.name() for p in processes_of(job.dir.path)]  # the supervisor, still ending
    time.sleep(2)
    left = [" ".join(p.cmdline()[:3]) for p in processes_of(job.dir.path)]
    return {
        "ranks": ranks,
        "state_after_stop": state,
        "seconds_to_all_running": round(all_running, 2),
        "seconds_to_all_stepped": round(all_running + all_stepped, 2),
        "supervisor_cpu_share": round(cpu / elapsed, 3),
        "supervisor_peak_rss_mib": round(peak_rss / 2**20, 1),
        "metrics_records_per_sec": round(records / elapsed, 1),
        "state_rewrites_per_sec": round(rewrites / elapsed, 2),
        "model_first_update_ms": round(first_update * 1000, 1),
        "model_update_ms": round(update * 1000, 2),
        "header_html_ms": round(header * 1000, 2),
        "table_html_ms": round(table * 1000, 2),
        "table_html_kib": round(len(table_html) / 1024, 1),
        "all_rows_html_ms": round(every_row * 1000, 2),
        "all_rows_html_kib": round(len(every_row_html) / 1024, 1),
        "chart_svg_ms": round(chart * 1000, 2),
        "chart_svg_kib": round(len(chart_svg) / 1024, 1),
        "rest_model_ms": round(rest * 1000, 2),
        "rest_model_kib": round(len(rest_model) / 1024, 1),
        "rest_list_entry_kib": round(len(listed) / 1024, 1),
        "stop_seconds": round(stop, 2),
        "processes_at_stop": named,
        "processes_left_2s_later": left,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between steps")
    args = parser.parse_args()
    os.environ["JUPYTER_DISTRAIN_LOCAL_PROCESS_LIMIT"] = str(max(args.ranks))
    os.environ.setdefault("JUPYTER_DISTRAIN_POOL", "0")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("JUPYTER_DISTRAIN_ROOT", str(Path(tmp) / "jobs"))
        for ranks in args.ranks:
            figures = measure(ranks, args.seconds, args.interval)
            print(json.dumps(figures), flush=True)
            results.append(figures)
    out = Path(__file__).parent / "results" / f"control_plane-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"raw figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
