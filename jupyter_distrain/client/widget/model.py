"""What the views of a job show, computed from the job store alone (state.json and
metrics.jsonl), independent of any UI: the rows, the job's images/sec, stragglers (by
their step time),
progress and the per-process images/sec series."""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ...contract.process import ProcessId, metric_number
from ...contract.status import (
    FINAL_STATES,
    JobStatus,
    ProcessRecord,
    aggregate_images_per_sec,
)
from ...contract.tail import LineReader
from ..job import Job

STRAGGLER_WINDOW = 20  # steps
STRAGGLER_RATIO = 1.25  # a median step time this many times the others' median, or more
CHART_POINTS = 300  # per worker, most recent
MAX_ROWS = 16  # past this many processes, the table groups the ones that do not stand out
FEW_IN_ROLE = 4  # a role with this many processes or fewer (the ps) is shown one by one
MAX_LINES = 8  # past this many processes, the chart draws the median of those not named


def stragglers(recent: Mapping[str, Sequence[float]], running: Collection[str]) -> dict[str, float]:
    """The running processes whose median step time over their recent steps is at least
    ``STRAGGLER_RATIO`` times the median of the other processes' medians, with that ratio,
    slowest first (``recent``: step seconds by process label)."""
    medians = {k: statistics.median(v) for k, v in recent.items() if v and k in running}
    ratios = {}
    for k, v in medians.items():
        others = statistics.median([m for o, m in medians.items() if o != k] or [0.0])
        if others > 0:
            ratios[k] = v / others
    slow = sorted((k for k, r in ratios.items() if r >= STRAGGLER_RATIO), key=lambda k: -ratios[k])
    return {k: ratios[k] for k in slow}


def stragglers_text(slow: Mapping[str, float]) -> str:
    """``rank 3: 1.8x the others' step time`` for each straggler, slowest first."""
    return "; ".join(
        f"{ProcessId.parse(k).describe()}: {ratio:.1f}x the others' step time"
        for k, ratio in slow.items()
    )


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


def processes_text(state: str, processes: Sequence[ProcessRecord]) -> str:
    """The processes in a few words: how many are up while the job launches or runs
    (``"1/2 processes up"``), how many finished once it has ended (``"2/2 finished"``,
    with those that failed or were stopped)."""
    if state not in FINAL_STATES:
        return launch_progress(processes)
    finished = sum(p.exit_code == 0 for p in processes)
    stopped = sum(p.stopped for p in processes)
    failed = sum(p.exit_code not in (0, None) and not p.stopped for p in processes)
    text = f"{finished}/{len(processes)} finished"
    return (
        text
        + (f", {failed} failed" if failed else "")
        + (f", {stopped} stopped" if stopped else "")
    )


def time_to_first_step(first_step_time: float | None, created: float | None) -> float | None:
    """Seconds from the job's creation to its first training step, once there is one."""
    if first_step_time is None or created is None:
        return None
    return first_step_time - created


class JobModel:
    """What the views show, computed from the store; independent of any UI."""

    def __init__(self, job: Job, from_start: bool = True):
        """``from_start``: the job's metrics from its start, else from now (a session's
        cell shows its own steps)."""
        self.job = job
        self.metrics = LineReader(job.dir.metrics_file, from_start)
        self.series: dict[str, deque[tuple[int, float]]] = defaultdict(
            lambda: deque(maxlen=CHART_POINTS)
        )
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=STRAGGLER_WINDOW))
        self.first_step_time: float | None = None
        self.total_steps: int | None = None
        self.compiled: dict[ProcessId, tuple[int, int]] = {}  # process: (reused, compiled)
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
        compiled = metric_number(record.get("compiled_programs"))
        if compiled is not None and process is not None:
            reused = metric_number(record.get("reused_programs")) or 0
            self.compiled[process] = (int(reused), int(compiled))
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
        seconds = metric_number(record.get("step_seconds"))
        if seconds is not None and seconds > 0:
            self.recent[str(process)].append(seconds)

    # --- derived facts -------------------------------------------------------
    def processes(self) -> list[ProcessRecord]:
        return self.status.processes

    def launch_progress(self) -> str:
        return launch_progress(self.processes())

    def time_to_first_step(self) -> float | None:
        return time_to_first_step(self.first_step_time, self.status.created)

    def aggregate_images_per_sec(self) -> float:
        return aggregate_images_per_sec(self.processes())

    def processes_text(self) -> str:
        return processes_text(self.status.state, self.processes())

    def rate(self) -> tuple[float, str]:
        """The job's images/sec as every view says it: the live processes' latest rates
        while it runs; once it has ended (nothing is live), the workers' last rates,
        "at the end"."""
        if self.status.state in FINAL_STATES:
            last = sum(p.images_per_sec or 0.0 for p in self.processes() if p.role == "worker")
            return last, "images/sec at the end"
        return self.aggregate_images_per_sec(), "images/sec"

    def compile_cache_text(self) -> str:
        """How many of its compiled programs the first process (rank 0 once it has
        compiled) took from the compilation cache; "" before any compiled
        (``worker/compile_cache.py``)."""
        if not self.compiled:
            return ""
        reused, compiled = self.compiled[min(self.compiled)]
        return f"{reused} of {compiled} compiled programs reused"

    def stragglers(self) -> dict[str, float]:
        """Running processes whose median step time over their last 20 steps is 1.25x the
        others' median or more, with that ratio, slowest first."""
        running = {str(p.id) for p in self.processes() if p.state == "running"}
        return stragglers(self.recent, running)

    def progress(self) -> tuple[float, float | None]:
        """Fraction done and seconds left, when the number of steps is known."""
        steps = (p.step for p in self.processes())
        return progress(steps, self.total_steps, self.first_step_time, time.time())


def row_of(p: ProcessRecord) -> dict[str, Any]:
    """A process's row as the widget shows it (``index``: its index in its role)."""
    heartbeat = p.heartbeat
    return {
        "role": p.role,
        "index": p.index,
        "host": p.host,
        "pid": p.pid,
        "state": p.state,
        "step": p.step,
        "images_per_sec": p.images_per_sec,
        "loss": p.loss,
        "since_heartbeat": None if heartbeat is None else max(0.0, time.time() - heartbeat),
        "gpu": gpu_text(p),
    }


def process_of(row: dict[str, Any]) -> ProcessId:
    """A row's process."""
    return ProcessId(row["role"], row["index"])


def _standing_out(rows: Sequence[dict[str, Any]], stragglers: Collection[str]) -> set[int]:
    """The indices of the rows shown one by one in a collapsed table: stragglers, a state
    other than the most common one, each role's first process and the processes of a
    role with few (the parameter servers); if those are too many, the stragglers and
    each role's first alone."""
    states = [str(r["state"]) for r in rows]  # (a forged report's may be anything)
    common = max(set(states), key=states.count)
    per_role = defaultdict(list)
    for i, r in enumerate(rows):
        per_role[str(r["role"])].append(i)
    firsts = {members[0] for members in per_role.values()}
    slow = {i for i, r in enumerate(rows) if str(process_of(r)) in stragglers}
    few = {i for members in per_role.values() if len(members) <= FEW_IN_ROLE for i in members}
    odd = {i for i, state in enumerate(states) if state != common}
    shown = firsts | slow | few | odd
    return shown if len(shown) <= MAX_ROWS else firsts | slow


def _group_row(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row for consecutive processes of a role in one state: their index range,
    hosts, step range, images/sec summed, median loss and oldest heartbeat."""
    first = members[0]
    if len(members) == 1:
        return first
    hosts = {str(m["host"]) for m in members}
    steps = [m["step"] for m in members if isinstance(m["step"], int | float)]
    losses = [m["loss"] for m in members if isinstance(m["loss"], int | float)]
    beats = [m["since_heartbeat"] for m in members if m["since_heartbeat"] is not None]
    rates = [m["images_per_sec"] for m in members if isinstance(m["images_per_sec"], int | float)]
    low, high = (min(steps), max(steps)) if steps else (None, None)
    return {
        "role": first["role"],
        "index": f"{first['index']}-{members[-1]['index']} ({len(members)})",
        "host": first["host"] if len(hosts) == 1 else f"{len(hosts)} hosts",
        "pid": None,
        "state": first["state"],
        "step": low if low == high else f"{low}-{high}",
        "images_per_sec": sum(rates) if rates else None,
        "loss": statistics.median(losses) if losses else None,
        "since_heartbeat": max(beats) if beats else None,
        "gpu": "",
        "group": len(members),
    }


def collapsed_rows(
    rows: Sequence[dict[str, Any]], stragglers: Collection[str]
) -> list[dict[str, Any]]:
    """The table's rows: every process's up to ``MAX_ROWS``; past that (a 128-rank job),
    those that stand out one by one and the others grouped, one row for each run of
    consecutive processes of a role in one state (``"group"``: how many it holds)."""
    if len(rows) <= MAX_ROWS:
        return list(rows)
    shown = _standing_out(rows, stragglers)
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        kind = (str(r["role"]), str(r["state"]))
        if run and (i in shown or kind != (str(run[0]["role"]), str(run[0]["state"]))):
            out.append(_group_row(run))
            run = []
        if i in shown:
            out.append(r)
        else:
            run.append(r)
    if run:
        out.append(_group_row(run))
    return out


def collapsed_series(
    series: Mapping[str, Sequence[tuple[int, float]]], named: Collection[str]
) -> dict[str, list[tuple[int, float]]]:
    """The chart's lines: every process's up to ``MAX_LINES``; past that, the ``named``
    processes' (stragglers, rank 0), at most ``MAX_LINES - 1``, and one line for the
    median of the others at each step."""
    if len(series) <= MAX_LINES:
        return {k: list(v) for k, v in series.items()}
    kept = [k for k in named if k in series][: MAX_LINES - 1]
    by_step: dict[int, list[float]] = defaultdict(list)
    others = [k for k in series if k not in kept]
    for k in others:
        for step, rate in series[k]:
            by_step[step].append(rate)
    median = [(step, statistics.median(rates)) for step, rates in sorted(by_step.items())]
    return {**{k: list(series[k]) for k in kept}, f"median of {len(others)} others": median}
