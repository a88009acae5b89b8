"""Fast checks of the client's rules, with no process started: the view's arithmetic, the
async-cell transformer, following a job directory written by hand, reading growing files,
process ids and the typed status."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import time
from pathlib import Path

import pytest

from jupyter_distrain.client import commands
from jupyter_distrain.client.follow import follow, follow_async, steps
from jupyter_distrain.client.job import Job, JobFailed, JobInterrupted
from jupyter_distrain.client.magics import async_cell
from jupyter_distrain.client.output import LogTail
from jupyter_distrain.client.widget import (
    JobModel,
    JobWidget,
    aggregate_images_per_sec,
    launch_progress,
    progress,
    stragglers,
    stragglers_text,
    time_to_first_step,
)
from jupyter_distrain.client.widget.model import (
    MAX_LINES,
    MAX_ROWS,
    collapsed_rows,
    collapsed_series,
)
from jupyter_distrain.client.widget.render import header_html
from jupyter_distrain.client.widget.text import summary_line
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import JobSpec
from jupyter_distrain.contract.status import JobStatus, ProcessRecord
from jupyter_distrain.contract.store import JobDir
from jupyter_distrain.contract.tail import MAX_PARTIAL_BYTES, LineReader, last_lines


def record(index: int, state: str = "running", role: str = "worker", **fields) -> ProcessRecord:
    return ProcessRecord(role=role, index=index, host="localhost", state=state, **fields)


# --- the view's arithmetic ------------------------------------------------------------
def test_stragglers_take_1_25x_the_others_median_step_time_or_more_and_say_how_much():
    recent = {
        "worker-0": [0.10] * 5,
        "worker-1": [0.104, 0.096, 0.10],  # median 0.1
        "worker-2": [0.10] * 3,
        "worker-3": [0.18, 0.01, 5.0],  # median 0.18: 1.8x
        "worker-4": [0.13] * 3,  # 1.3x
    }
    running = set(recent)
    assert stragglers(recent, running) == pytest.approx({"worker-3": 1.8, "worker-4": 1.3})
    assert list(stragglers(recent, running)) == ["worker-3", "worker-4"]  # slowest first
    assert stragglers_text(stragglers(recent, running)) == (
        "rank 3: 1.8x the others' step time; rank 4: 1.3x the others' step time"
    )
    assert stragglers({**recent, "worker-3": [0.12], "worker-4": [0.1]}, running) == {}
    assert list(stragglers(recent, running - {"worker-3"})) == ["worker-4"]  # running ones only
    assert stragglers({"worker-0": [1.0], "worker-1": []}, {"worker-0", "worker-1"}) == {}
    assert stragglers({"worker-0": [0.2], "worker-1": [0.4]}, {"worker-0", "worker-1"}) == {
        "worker-1": 2.0  # of two ranks, one twice as slow: 2x the other
    }
    assert stragglers({}, set()) == {}


def test_progress_is_the_furthest_step_over_the_total_with_an_eta():
    assert progress([None, 50, 40], 100, first_step_time=10.0, now=20.0) == (0.5, 10.0)
    assert progress([150], 100, first_step_time=10.0, now=20.0) == (1.0, 0.0)
    assert progress([50], None, first_step_time=10.0, now=20.0) == (0.0, None)
    assert progress([None, 0], 100, first_step_time=10.0, now=20.0) == (0.0, None)
    assert progress([25], 100, first_step_time=None, now=20.0) == (0.25, 0.0)


def test_aggregate_images_per_sec_sums_live_processes_only():
    processes = [
        record(0, "running", images_per_sec=100.0),
        record(1, "starting", images_per_sec=50.0),
        record(2, "exited", images_per_sec=200.0),
        record(3, "running", images_per_sec=None),
    ]
    assert aggregate_images_per_sec(processes) == 150.0
    assert aggregate_images_per_sec([]) == 0.0


def test_launch_progress_and_time_to_first_step():
    processes = [record(0, "running"), record(1, "starting"), record(0, "pending", role="ps")]
    assert launch_progress(processes) == "1/3 processes up"
    assert launch_progress([]) == "0/0 processes up"
    assert time_to_first_step(12.5, 10.0) == 2.5
    assert time_to_first_step(None, 10.0) is None
    assert time_to_first_step(12.5, None) is None


@pytest.mark.parametrize(
    ("state", "exits", "up", "rate"),
    [
        ("running", [None, None], "2/2 processes up", "4,404 images/sec"),
        ("succeeded", [0, 0], "2/2 finished", "4,404 images/sec at the end"),
        ("failed", [1, 0], "1/2 finished, 1 failed", "4,404 images/sec at the end"),
    ],
)
def test_the_summary_line_says_what_the_widget_says(tmp_path, state, exits, up, rate):
    """At every moment: processes up while it runs, finished after (a succeeded job read
    "0/2 processes up", like a failure), and the widget's rate (it read 0 images/sec at
    the end while the widget said 4,404)."""
    job_dir = new_job_dir(tmp_path)
    live = "running" if state == "running" else "exited"
    processes = [
        record(i, live, step=3, images_per_sec=2202.0, exit_code=code)
        for i, code in enumerate(exits)
    ]
    job_dir.write_state(JobStatus(state=state, workers=2, processes=processes))
    model = JobModel(Job(job_dir))
    model.update()
    line = summary_line(model)
    assert line == f"[{job_dir.id}] {state}: {up}, step 3, {rate}"
    number, what = rate.split(" ", 1)
    assert f"<b>{number}</b> {what}" in header_html(model)


def test_job_model_reads_metrics_incrementally_keyed_by_process(tmp_path):
    job = Job(new_job_dir(tmp_path))
    lines = [
        {"role": "worker", "index": 0, "time": 5.0, "step": 1, "images_per_sec": 10.0},
        {"role": "worker", "index": 1, "step": 1, "images_per_sec": 12.0, "total_steps": 4},
        {"role": "worker", "index": 0, "heartbeat": True},  # no step
        {"rank": 0, "step": 2, "images_per_sec": 1.0},  # no role/index: not a process's
    ]
    status = JobStatus(state="running", created=4.0, processes=[record(0, step=2), record(1)])
    with open(job.dir.metrics_file, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in lines) + "not json\n[1, 2]\n")
        f.write('{"role": "worker", "index": 0, "step": 2, "images_per_sec": 11.0')  # partial
    model = JobModel(job)
    model.update(status)
    assert {k: list(v) for k, v in model.series.items()} == {
        "worker-0": [(1, 10.0)],
        "worker-1": [(1, 12.0)],
    }
    assert model.total_steps == 4 and model.time_to_first_step() == 1.0
    with open(job.dir.metrics_file, "a") as f:
        f.write("}\n")
    model.update(status)
    assert list(model.series["worker-0"]) == [(1, 10.0), (2, 11.0)]
    assert model.progress()[0] == 0.5


def test_widget_rows_process_picker_and_log_view_from_a_written_job(tmp_path):
    job_dir = new_job_dir(tmp_path)
    processes = [record(0, pid=5, step=3, images_per_sec=10.0), record(0, role="ps")]
    job_dir.write_state(JobStatus(state="running", workers=1, processes=processes))
    append(job_dir, ProcessId("ps", 0), "".join(f"ps line {i}\n" for i in range(100)))
    widget = JobWidget(Job(job_dir))
    assert [(r["role"], r["index"], r["pid"], r["step"]) for r in widget.rows] == [
        ("worker", 0, 5, 3),
        ("ps", 0, None, None),
    ]
    assert widget.job_state == "running" and widget.aggregate_images_per_sec == 10.0
    assert widget.launch_progress == "2/2 processes up"
    assert list(widget.process_picker.options) == ["worker-0", "ps-0"]
    widget.logs_button.value = True
    widget.process_picker.value = "ps-0"
    assert (
        "ps line 99</pre>" in widget.log_view.value and "ps line 59\n" not in widget.log_view.value
    )
    assert ">gpu<" not in widget.table.value  # no GPUs: no column
    processes[0].gpu_percent, processes[0].gpu_memory = 55.0, 2**30
    job_dir.write_state(JobStatus(state="running", workers=1, processes=processes))
    widget.refresh(force=True)
    assert ">gpu<" in widget.table.value and "55% 1.0 GiB" in widget.table.value


def test_a_128_rank_job_shows_the_processes_that_stand_out_and_groups_the_others(tmp_path):
    """Past 16 processes the table shows rank 0, a rank in another state and the parameter
    servers one by one, the rest as one row per run of a role in one state, and says so;
    All rows shows every one; the chart draws rank 0 and the median of the others."""
    job_dir = new_job_dir(tmp_path)
    workers = [
        record(
            i,
            "failed" if i == 70 else "running",
            pid=100 + i,
            step=400 + i % 3,
            images_per_sec=10.0,
            loss=0.5,
            heartbeat=time.time() - i % 5,
        )
        for i in range(128)
    ]
    processes = [*workers, record(0, role="ps"), record(1, role="ps")]
    job_dir.write_state(JobStatus(state="running", workers=128, processes=processes))
    metrics = "".join(
        json.dumps({"role": "worker", "index": i, "step": s, "images_per_sec": 10.0 + i % 2}) + "\n"
        for s in (1, 2)
        for i in range(128)
    )
    job_dir.metrics_file.write_text(metrics)
    widget = JobWidget(Job(job_dir))
    table = widget.table.value
    assert table.count("<tr") == 1 + 6  # head; rank 0, 1-69, 70, 71-127, ps 0, ps 1
    assert "130 processes: 126 that do not stand out are grouped" in table
    assert ">1-69 (69)<" in table and ">71-127 (57)<" in table and ">400-402<" in table
    assert ">690<" in table  # 69 x 10 images/sec
    assert widget.all_rows_button.layout.display != "none"
    chart = widget.chart.value
    assert chart.count("<polyline") == 2 and "median of 127 others" in chart
    widget.all_rows_button.value = True
    assert widget.table.value.count("<tr") == 1 + 130 and "grouped" not in widget.table.value


def test_a_small_job_keeps_one_row_and_one_line_per_process():
    rows = [{"role": "worker", "index": i, "state": "running"} for i in range(MAX_ROWS)]
    assert collapsed_rows(rows, []) == rows
    series = {f"worker-{i}": [(1, 1.0)] for i in range(MAX_LINES)}
    assert collapsed_series(series, []) == series


def test_every_field_of_a_reported_row_is_escaped_in_the_widget(tmp_path):
    # a row holds what a host reported: a forged host, index (rank), pid or step is text
    job_dir = new_job_dir(tmp_path)
    forged = {
        "role": "worker",
        "index": "<script>rank()</script>",
        "host": "<script>host()</script>",
        "pid": "<img src=x onerror=pid()>",
        "step": "<b>step</b>",
        "state": "running",
    }
    job_dir.state_file.write_text(json.dumps({"state": "running", "processes": [forged]}))
    widget = JobWidget(Job(job_dir))
    shown = widget.table.value + widget.snapshot_html()
    assert "<script>" not in shown and "<img" not in shown and "<b>step" not in shown
    assert "&lt;script&gt;rank()&lt;/script&gt;" in widget.table.value
    assert "&lt;script&gt;host()&lt;/script&gt;" in widget.table.value


def test_status_command_lines(tmp_path, capsys):
    job_dir = new_job_dir(tmp_path)
    processes = [record(0, "exited", pid=7, exit_code=0), record(1, "killed", exit_code=-9)]
    job_dir.write_state(JobStatus(state="failed", error="rank 1 failed first", processes=processes))
    commands.print_status(Job(job_dir))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{job_dir.id:<24} failed       1 workers  auto/local  ")
    assert lines[1:] == [
        "error: rank 1 failed first",
        "  worker-0   pid 7        localhost    exited (exit 0)",
        "  worker-1   pid -        localhost    killed (exit -9)",
    ]


# --- the async cell ------------------------------------------------------------------------
def test_async_cell_turns_a_distributed_cell_into_one_await():
    body = "x = 'quote\" and \\\\ backslash'\nprint(x)\n"
    lines = async_cell(["%%distributed --workers 2 --name a\n", *body.splitlines(True)])
    assert len(lines) == 1 and lines[0].startswith("await get_ipython().find_cell_magic(")
    tree = ast.parse(lines[0])
    call = tree.body[0].value.value
    assert call.func.attr == "distributed_async"
    line, cell = call.args
    assert line.func.attr == "var_expand"  # `{name}` in the line, as IPython expands it
    assert [ast.literal_eval(a) for a in (*line.args, cell)] == ["--workers 2 --name a", body]


@pytest.mark.parametrize(
    "lines",
    [
        [],
        ["print(1)\n"],
        ["%%distributedx\n", "print(1)\n"],  # another magic's name
        ["%%distributed?\n"],  # a help request
        ["%distributed list\n"],  # the line magic
    ],
)
def test_async_cell_leaves_other_cells_alone(lines):
    assert async_cell(list(lines)) == lines


# --- following a job directory written by hand ----------------------------------------------
def new_job_dir(tmp_path: Path) -> JobDir:
    return JobDir.create(JobSpec(code="pass\n", name="rules", grace=0), root=tmp_path)


def append(job_dir: JobDir, process: ProcessId, text: str) -> None:
    with open(job_dir.log_file(process), "a") as f:
        f.write(text)


class Recorder:
    """A view that keeps every refresh it was given."""

    def __init__(self, on_tick=None):
        self.calls: list[tuple[bool, str | None]] = []
        self.on_tick = on_tick

    def refresh(self, force: bool = False, status: JobStatus | None = None) -> None:
        self.calls.append((force, None if status is None else status.state))
        if not force and self.on_tick is not None:
            self.on_tick()


def test_follow_prints_labelled_lines_until_a_final_state(tmp_path):
    job_dir = new_job_dir(tmp_path)
    job, out, view = Job(job_dir), io.StringIO(), Recorder()
    job_dir.write_state(JobStatus(state="running"))
    append(job_dir, ProcessId("worker", 0), "hello from 0\npartial")
    append(job_dir, ProcessId("ps", 0), "ps up\n")
    watch = steps(job, view, stream=True, out=out)
    assert next(watch) > 0
    assert out.getvalue() == "[ps-0] ps up\n[0] hello from 0\n"
    append(job_dir, ProcessId("worker", 0), " line\n")
    append(job_dir, ProcessId("worker", 1), "late\nno newline")  # appeared after the start
    job_dir.write_state(JobStatus(state="succeeded"))
    with pytest.raises(StopIteration) as end:
        next(watch)
    assert end.value.value == "succeeded"
    assert out.getvalue().splitlines()[2:] == ["[0] partial line", "[1] late", "[1] no newline"]
    assert view.calls == [(False, "running"), (False, "succeeded")]


def test_follow_without_stream_prints_nothing_and_refreshes_the_view_at_the_end(tmp_path):
    job_dir = new_job_dir(tmp_path)
    append(job_dir, ProcessId("worker", 0), "hidden\n")
    job_dir.write_state(JobStatus(state="stopped"))
    out, view = io.StringIO(), Recorder()
    assert follow(Job(job_dir), view, stream=False, out=out) == "stopped"
    assert out.getvalue() == "" and view.calls == [(False, "stopped"), (True, None)]


def test_follow_raises_job_failed_with_the_error_and_its_tail(tmp_path):
    job_dir = new_job_dir(tmp_path)
    job_dir.write_state(JobStatus(state="failed", error="rank 1 failed first", error_tail="Boom"))
    with pytest.raises(JobFailed) as failure:
        follow(Job(job_dir), out=io.StringIO())
    assert str(failure.value) == f"job {job_dir.id} failed: rank 1 failed first"
    assert failure.value._render_traceback_()[-1] == "Boom"


def test_follow_times_out(tmp_path):
    job_dir = new_job_dir(tmp_path)
    job_dir.write_state(JobStatus(state="running"))
    with pytest.raises(TimeoutError, match="still running after 0 s"):
        next(steps(Job(job_dir), timeout=0, out=io.StringIO()))


def test_an_interrupt_stops_the_job_and_says_so(tmp_path):
    job_dir = new_job_dir(tmp_path)
    job_dir.write_state(JobStatus(state="running"))

    def interrupt() -> None:  # Ctrl-C during a poll; the job has stopped by the time we ask
        job_dir.write_state(JobStatus(state="stopped"))
        raise KeyboardInterrupt

    out, view = io.StringIO(), Recorder(on_tick=interrupt)
    with pytest.raises(KeyboardInterrupt):
        follow(Job(job_dir), view, out=out)
    assert out.getvalue() == (
        f"Interrupted: stopping job {job_dir.id} ...\nJob {job_dir.id} stopped.\n"
    )
    assert view.calls[-1] == (True, None)
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        follow(Job(job_dir), Recorder(on_tick=interrupt), out=out, stop_on_interrupt=False)
    assert out.getvalue() == ""


def test_the_async_follow_turns_a_cancellation_into_job_interrupted(tmp_path):
    job_dir = new_job_dir(tmp_path)
    job_dir.write_state(JobStatus(state="running"))

    async def cancel_while_following(stop: bool) -> str:
        out = io.StringIO()
        task = asyncio.ensure_future(follow_async(Job(job_dir), out=out, stop_on_interrupt=stop))
        await asyncio.sleep(0.05)  # the follow is between polls
        job_dir.write_state(JobStatus(state="stopped"))
        task.cancel()
        try:
            await task
        finally:
            assert ("Interrupted" in out.getvalue()) is stop
        return out.getvalue()

    with pytest.raises(JobInterrupted) as interrupted:
        asyncio.run(cancel_while_following(stop=True))
    assert interrupted.value._render_traceback_() == [
        f"KeyboardInterrupt: job {job_dir.id} stopped"
    ]
    job_dir.write_state(JobStatus(state="running"))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_while_following(stop=False))


def test_the_async_follow_returns_the_final_state(tmp_path):
    job_dir = new_job_dir(tmp_path)
    append(job_dir, ProcessId("chief", 0), "chief says\n")
    job_dir.write_state(JobStatus(state="succeeded"))
    out = io.StringIO()
    assert asyncio.run(follow_async(Job(job_dir), out=out)) == "succeeded"
    assert out.getvalue() == "[chief-0] chief says\n"


def test_log_tail_from_the_end_and_job_logs(tmp_path):
    job_dir = new_job_dir(tmp_path)
    append(job_dir, ProcessId("worker", 0), "old\n")
    tail = LogTail(job_dir, from_start=False)
    append(job_dir, ProcessId("worker", 0), "new\n")
    assert tail.read() == ["[0] new"]
    job = Job(job_dir)
    assert job.logs() == "[0] old\n[0] new"
    assert job.logs(ProcessId("worker", 0)) == "old\nnew\n"
    with pytest.raises(KeyError, match="has no log for worker 3"):
        job.logs(ProcessId("worker", 3))


# --- reading growing files ---------------------------------------------------------------------
def test_line_reader_returns_complete_lines_and_keeps_the_partial_one(tmp_path):
    path = tmp_path / "log"
    reader = LineReader(path)
    assert reader.read() == []  # no file yet
    path.write_bytes(b"a\nb")
    assert reader.read() == [b"a"]
    assert reader.read() == []
    with open(path, "ab") as f:
        f.write(b"c\nd")
    assert reader.read() == [b"bc"]
    assert reader.flush() == [b"d"] and reader.flush() == []


def test_line_reader_from_the_end(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"before\n")
    reader = LineReader(path, from_start=False)
    with open(path, "ab") as f:
        f.write(b"after\n")
    assert reader.read() == [b"after"]
    missing = LineReader(tmp_path / "later", from_start=False)
    (tmp_path / "later").write_bytes(b"first\n")
    assert missing.read() == [b"first"]  # a file made later is read from its start


def test_line_reader_from_the_end_after_the_last_lines_there(tmp_path):
    """What ``attach`` reads: each log's last lines, then what comes."""
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"tick %d\n" % i for i in range(12)) + b"partial")
    reader = LineReader(path, from_start=False, last=3)
    with open(path, "ab") as f:
        f.write(b" line\nafter\n")
    assert reader.read() == [b"tick 9", b"tick 10", b"tick 11", b"partial line", b"after"]
    path.write_bytes(b"one\ntwo\n")
    assert LineReader(path, from_start=False, last=10).read() == [b"one", b"two"]
    assert LineReader(path, from_start=False, last=0).read() == []


def test_line_reader_cuts_a_progress_bar_without_newlines(tmp_path):
    path = tmp_path / "log"
    bar = b"step\r" * (MAX_PARTIAL_BYTES // 5 + 10)
    path.write_bytes(bar)
    assert LineReader(path).read() == [bar]  # handed out, not held in memory
    reader = LineReader(path)
    path.write_bytes(b"short\r")
    assert reader.read() == [] and reader.flush() == [b"short\r"]


def test_last_lines_reads_only_the_end(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert last_lines(path, 3) == "line 997\nline 998\nline 999"
    assert last_lines(path, 1, max_bytes=12) == "line 999"  # reads 12 bytes, not the file
    assert last_lines(tmp_path / "missing", 5) == ""


# --- process ids and the typed status --------------------------------------------------------
@pytest.mark.parametrize(
    "process", [ProcessId("worker", 0), ProcessId("ps", 12), ProcessId("chief", 0)]
)
def test_process_id_round_trips(process):
    assert ProcessId.parse(str(process)) == process
    assert ProcessId.of(process.fields()) == process
    assert ProcessId.of(json.loads(json.dumps({**process.fields(), "step": 1}))) == process


def test_process_id_text_and_descriptions():
    assert str(ProcessId("worker", 1)) == "worker-1"
    assert ProcessId.parse("my-role-3") == ProcessId("my-role", 3)
    assert [ProcessId(r, i).describe() for r, i in [("worker", 1), ("ps", 0), ("chief", 0)]] == [
        "rank 1",
        "ps 0",
        "chief",
    ]


@pytest.mark.parametrize("text", ["worker", "worker-", "-1", "worker-x", "worker-1.5", ""])
def test_process_id_rejects_bad_text(text):
    with pytest.raises(ValueError, match="not a process id"):
        ProcessId.parse(text)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"role": "worker"},
        {"index": 0},
        {"rank": 0, "step": 1},
        {"role": 1, "index": 0},
        {"role": "worker", "index": "0"},
        {"role": "worker", "index": True},
    ],
)
def test_process_id_of_malformed_fields_is_none(fields):
    assert ProcessId.of(fields) is None


def test_job_status_round_trips_through_json():
    status = JobStatus(
        state="running",
        backend="ps",
        workers=2,
        created=1.5,
        processes=[record(0, pid=11, step=3, loss=0.25), record(0, role="ps", pid=12)],
        helpers=[record(0, role="mpirun", hosts=["a", "b"])],
        backend_info={"cluster": {"ps": ["h:1"], "worker": ["h:2", "h:3"]}},
    )
    data = json.loads(json.dumps(status.to_dict()))
    assert JobStatus.from_dict(data) == status
    assert JobStatus.from_dict({**data, "from_the_future": 1}) == status
    again = JobStatus.from_dict(data)
    assert again.process(ProcessId("ps", 0)).pid == 12 and again.pids() == [11, 12]
    assert not again.done and JobStatus(state="stopped").done


def test_an_elastic_state_that_cannot_take_a_joining_worker_is_warned_about():
    from jupyter_distrain.contract.cellcheck import elastic_warnings

    assert elastic_warnings("state = hvd.elastic.TensorFlowKerasState(model, opt)") == []
    (warning,) = elastic_warnings("state = hvd.elastic.TensorFlowState(model.variables)")
    assert "TensorFlowState cannot take in a joining worker" in warning


def test_images_per_sec_is_a_windowed_rate_that_ranks_in_lock_step_share():
    from jupyter_distrain.worker.instrument import RateWindow

    # two ranks in lock-step: each step one waits in the allreduce, alternating
    fast, slow = RateWindow(), RateWindow()
    end, shown = 0.0, []
    for step in range(200):
        end += 0.01
        a, b = (0.004, 0.01) if step % 2 else (0.01, 0.004)
        shown.append((fast.add(end, 64, a), slow.add(end, 64, b)))
    ra, rb = shown[-1]
    assert abs(ra - rb) / ra < 0.02 and abs(ra - 6400) / 6400 < 0.02  # 64 images per 10 ms
    assert len(fast.steps) <= 301  # only the last 3 s are kept
    assert RateWindow().add(5.0, 32, 0.5) == 64.0  # a first step: its own rate


def test_a_sessions_widget_offers_no_resize(tmp_path):
    """A session's variables live in its ranks: its widget's - and + stay disabled, while
    a job's are live; Stop stays live for both."""
    for session, disabled in ((None, False), ("s", True)):
        root = tmp_path / str(session)
        root.mkdir(mode=0o700)
        job_dir = JobDir.create(JobSpec(code="", session=session), root=root)
        job_dir.write_state(JobStatus(state="running", workers=2))
        widget = JobWidget(Job(job_dir))
        widget.refresh(force=True)
        assert (widget.minus_button.disabled, widget.plus_button.disabled) == (disabled,) * 2
        assert not widget.stop_button.disabled
