"""Job lifecycle from a real kernel: bad input, failures, interrupt, kernel death, attach.

These cells are plain Python (no TensorFlow) so that each job takes a second or two;
the processes, signals and supervisor are all real.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    STACKS_PROGRAM,
    CellOutput,
    check_stacks_of_the_odd_rank,
    job_pids,
    only_job,
    running,
    wait_for,
)

from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.store import list_job_dirs


def test_syntax_error_is_reported_with_the_cell_line_and_launches_nothing(kernel, jobs_root):
    out = kernel.execute("%%distributed --workers 2\nx = 1\nif x ==\n    print(x)\n")
    assert out.error is not None
    assert out.error["ename"] == "UsageError"
    assert "line 3" in out.error["evalue"] and "train.py line 2" in out.error["evalue"]
    assert list_job_dirs(jobs_root) == []


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("--bogus 1", "--bogus"),
        ("--workers 0", "--workers"),
        ("--memory abc", "--memory"),
        ("--env NOEQUALS", "--env"),
        ("--backend nosuch", "--backend"),
        ("--push undefined_thing", "--push"),
        ("--workers 2 --min-workers 3 --max-restarts 1", "--min-workers must be"),
        ("--workers 2 --min-workers 1", "--min-workers needs --max-restarts"),
    ],
)
def test_bad_flags_give_one_line_and_launch_nothing(kernel, jobs_root, flags, expected):
    out = kernel.execute(f"%%distributed {flags}\nprint('never')\n")
    assert out.error is not None and out.error["ename"] == "UsageError"
    assert expected in out.error["evalue"]
    assert "\n" not in out.error["evalue"].strip()
    assert "never" not in out.stdout
    assert list_job_dirs(jobs_root) == []


def test_the_magic_line_expands_notebook_variables_as_ipython_does(kernel):
    kernel.execute("n, label = 2, 'expanded'")
    out = kernel.execute("%%distributed --workers {n} --name $label\nprint('hi')\n")
    assert out.error is None, out.error_text
    assert re.search(r"^Job expanded-\w+: 2 workers", out.stdout, re.M), out.stdout
    assert "[1] hi" in out.stdout


def test_a_distributed_cell_is_complete_at_a_blank_line_as_every_cell_magic(kernel):
    """A front-end that asks the kernel whether the input is complete (``jupyter
    console``, qtconsole) must let a ``%%distributed`` cell go on past its first line."""
    for code, status in [
        ("%%distributed --workers 2", "incomplete"),
        ("%%distributed --workers 2\nimport time", "incomplete"),
        ("%%distributed --workers 2\nimport time\n\n", "complete"),
    ]:
        kernel.kc.is_complete(code)
        reply = kernel.kc.get_shell_msg(timeout=30)
        assert reply["msg_type"] == "is_complete_reply"
        assert reply["content"]["status"] == status, code


def test_undefined_names_are_warned_about(kernel):
    kernel.execute("data = [1, 2, 3]")
    out = kernel.execute(
        "%%distributed --workers 1\ntry:\n    print(len(data))\nexcept NameError:\n    print('no data')\n"
    )
    assert "data" in out.stderr and "--push data" in out.stderr
    assert "[0] no data" in out.stdout


def test_failing_worker_fails_the_job_names_the_rank_and_stops_the_others(kernel, jobs_root):
    cell = (
        "%%distributed --workers 2\n"
        "import os, time\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    time.sleep(0.5)\n"
        "    raise ValueError('bad batch on rank one')\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    out = kernel.execute(cell)
    elapsed = time.monotonic() - started
    assert out.error is not None and out.error["ename"] == "JobFailed"
    assert "rank 1 failed first" in out.error["evalue"]
    assert any("ValueError: bad batch on rank one" in line for line in out.error["traceback"])
    assert elapsed < 20  # rank 0 would have slept 120 s
    job = only_job(jobs_root)
    state = job.read_state()
    assert state.state == "failed"
    failed_at = next(
        e["time"]
        for e in job.read_events()
        if e.get("process") == "worker-1" and e["event"] == "exit"
    )
    ended_at = next(e["time"] for e in job.read_events() if e.get("state") == "failed")
    assert ended_at - failed_at < 2.0
    wait_for(lambda: not any(running(p) for p in job_pids(job)), 5, what="job processes to exit")


def test_a_rank_that_crashes_in_native_code_shows_where_it_was(kernel, jobs_root):
    """A segmentation fault in rank 1 (``ctypes.string_at(0)``): the cell names the
    signal and shows the rank's Python stack at the fault (the cell's own file and line),
    not "exit code -11"; nothing is left."""
    cell = (
        "%%distributed --workers 2\n"
        "import ctypes, os, time\n"
        "def read_a_bad_pointer():\n"
        "    return ctypes.string_at(0)\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    read_a_bad_pointer()\n"
        "time.sleep(120)\n"
    )
    out = kernel.execute(cell)
    assert out.error is not None and out.error["ename"] == "JobFailed"
    assert "rank 1 failed first (killed by SIGSEGV, a segmentation fault)" in out.error["evalue"]
    shown = "\n".join(out.error["traceback"])
    assert "Fatal Python error: Segmentation fault" in shown, shown
    assert re.search(r'File ".*train\.py", line 3 in read_a_bad_pointer', shown), shown
    job = only_job(jobs_root)
    wait_for(lambda: not any(running(p) for p in job_pids(job)), 5, what="job processes to exit")


def memory_cgroup(limit: int) -> Path:
    """A new memory cgroup under this process's, holding at most ``limit`` bytes (v1 or
    v2, whichever holds the memory controller here)."""
    text = Path("/proc/self/cgroup").read_text()
    lines = [line.split(":", 2) for line in text.splitlines()]
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    parent = Path(f"/sys/fs/cgroup/memory{v1[0]}" if v1 else f"/sys/fs/cgroup{lines[0][2]}")
    group = parent / f"distrain-oom-{os.getpid()}"
    group.mkdir()
    limit_file, swap_file = (
        ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        if v1
        else ("memory.max", "memory.swap.max")
    )
    (group / limit_file).write_text(str(limit))
    with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
        (group / swap_file).write_text(str(limit) if v1 else "0")
    return group


OOM = """\
import os, time
if os.environ["JUPYTER_DISTRAIN_RANK"] == "1":
    held = []
    while True:  # 40 MiB more every 0.1 s, until the OOM killer ends it
        block = bytearray(40 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        held.append(block)
        time.sleep(0.1)
time.sleep(5)  # plain ranks are independent: the job ends when both have
"""


@pytest.mark.root  # a memory cgroup with a limit
def test_a_rank_the_oom_killer_ends_is_said_to_be_out_of_memory_with_what_it_held(
    jobs_root, tmp_path
):
    """The job runs in a memory cgroup of 600 MiB (its supervisor started there, as in
    a container with a memory limit): rank 1 grows until the kernel's OOM killer ends
    it; the job fails saying so, with the memory rank 1 held, not "killed by SIGKILL"."""
    group = memory_cgroup(600 * 2**20)
    submitter = (
        "import contextlib\n"
        "from jupyter_distrain import JobFailed, JobSpec, submit\n"
        f"job = submit(JobSpec(code={OOM!r}, workers=2, backend='plain', grace=1))\n"
        "print(job.id, flush=True)\n"
        "with contextlib.suppress(JobFailed):\n"
        "    job.wait(120)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", submitter],
            capture_output=True,
            text=True,
            timeout=180,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        assert done.returncode == 0, done.stderr
        job = Job.attach(done.stdout.split()[-1])
        status = job.status()
        assert status.state == "failed", status
        assert re.fullmatch(
            r"rank 1 failed first \(killed by the OOM killer: out of memory, holding "
            r"0\.\d\d GiB at its last sample\)",
            status.error,
        ), status.error
        assert status.process(ProcessId("worker", 1)).oom_killed
        assert status.process(ProcessId("worker", 0)).exit_code == 0
        wait_for(lambda: not any(running(p) for p in job_pids(job.dir)), 10, what="the job gone")
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), 10, what="empty")
        group.rmdir()


def test_stacks_show_where_every_rank_stands_grouped_and_the_job_runs_on(kernel, jobs_root):
    """``%distributed stacks JOB`` on a running local job: rank 1, waiting elsewhere than
    the others, comes first with its line; the others are one group; nothing stopped;
    an ended job shows the last stacks taken."""
    program = STACKS_PROGRAM.replace("'", "\\'").replace("\n", "\\n")
    out = kernel.execute(
        f"job = get_ipython().run_cell_magic('distributed', '--workers 3 --background', "
        f"'{program}')"
    )
    assert out.error is None, out.error_text
    job = Job(only_job(jobs_root))
    report = check_stacks_of_the_odd_rank(job, 3)
    pids = [p.pid for p in report.processes]
    out = kernel.execute(f"%distributed stacks {job.id}")
    assert out.error is None, out.error_text
    lines = out.stdout.splitlines()
    assert re.fullmatch(
        r"stacks of 3 processes at [\d:]+ \(request\): 2 different stacks", lines[0]
    )
    assert lines[1] == "  rank 1: train.py:6 in load_batch  time.sleep(300)"
    assert "  ranks 0, 2: train.py:4 in wait_for_peers  time.sleep(300)" in lines
    assert all(running(pid) for pid in pids)
    assert job.stop() == "stopped"
    out = kernel.execute(f"%distributed stacks {job.id}")
    assert out.stdout.startswith(f"Job {job.id} has ended (stopped); the last stacks taken")
    assert "  rank 1: train.py:6 in load_batch  time.sleep(300)" in out.stdout


def test_a_failed_rank_restarts_the_job_which_resumes_from_its_checkpoint(kernel, jobs_root):
    """``--max-restarts 2``: rank 1 fails on the first try, after rank 0 saved a
    checkpoint; the job restarts once, both ranks resume from that checkpoint and it
    succeeds; the cell says so, and rank 1's log keeps the first try's traceback."""
    cell = (
        "%%distributed --workers 2 --backend plain --max-restarts 2 --grace 1\n"
        "import os, pathlib\n"
        "checkpoints = pathlib.Path(os.environ['JUPYTER_DISTRAIN_JOB_DIR'], 'checkpoints')\n"
        "saved, rank = checkpoints / 'step', os.environ['JUPYTER_DISTRAIN_RANK']\n"
        "start = int(saved.read_text()) if saved.exists() else 0\n"
        "print('rank', rank, 'resumes at step', start, flush=True)\n"
        "if rank == '0' and start == 0:\n"
        "    saved.write_text('40')\n"
        "tried = checkpoints / f'tried-{rank}'\n"
        "if rank == '1' and not tried.exists():\n"
        "    tried.write_text('once')\n"
        "    raise ValueError('a bad batch on the first try')\n"
    )
    out = kernel.execute(cell, timeout=120)
    assert out.error is None, out.error_text
    assert (
        "Warning: restart 1 of 2 after rank 1 failed first (exit code 1); "
        "its log keeps the traceback"
    ) in out.stderr
    assert "[0] rank 0 resumes at step 40" in out.stdout
    assert "[1] rank 1 resumes at step 40" in out.stdout
    job = only_job(jobs_root)
    status = job.read_state()
    assert (status.state, status.restarts, status.generation) == ("succeeded", 1, 1)
    shown = kernel.execute(f"%distributed status {job.id}").stdout
    assert "restarts: 1 (restart 1 of 2 after rank 1 failed first (exit code 1);" in shown, shown
    log = job.log_file(ProcessId("worker", 1)).read_text()
    assert log.index("ValueError: a bad batch on the first try") < log.rindex(
        "rank 1 resumes at step 40"
    )
    wait_for(lambda: not any(running(p) for p in job_pids(job)), 5, what="job processes to exit")


def test_interrupt_stops_every_process_within_grace(kernel, jobs_root):
    grace = 3
    cell = (
        f"%%distributed --workers 2 --grace {grace}\n"
        "import signal, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"  # a grandchild of the supervisor
        "print('child', child.pid, flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"  # a worker that ignores SIGTERM
        "time.sleep(300)\n"
    )
    msg_id = kernel.submit(cell)
    job = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    logs = [job.log_file(ProcessId("worker", i)) for i in range(2)]
    wait_for(
        lambda: all(p.exists() and "child" in p.read_text() for p in logs), 30, what="children"
    )
    grandchildren = [int(p.read_text().split()[1]) for p in logs]
    pids = job_pids(job) + grandchildren
    assert all(running(p) for p in pids)
    interrupted = time.monotonic()
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    # a %%distributed cell runs as an async cell in a kernel: the interrupt cancels it
    assert out.error is not None and out.error["ename"] in ("KeyboardInterrupt", "JobInterrupted")
    wait_for(lambda: not any(running(p) for p in pids), grace + 2, what="every process gone")
    assert time.monotonic() - interrupted < grace + 2
    assert job.read_state().state == "stopped"
    assert f"Job {job.id} stopped." in out.stdout


def test_job_outlives_a_killed_kernel_and_attach_sees_it_succeed(kernel, new_kernel, jobs_root):
    kernel.submit(
        "%%distributed --workers 2 --name survivor\nimport time\ntime.sleep(4)\nprint('done')\n"
    )
    job = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    wait_for(lambda: job.read_state().state == "running", 30, what="running")
    kernel_pid = kernel.pid
    os.kill(kernel_pid, signal.SIGKILL)  # as the OOM killer would
    wait_for(lambda: not running(kernel_pid), 10, what="kernel gone")
    assert job.read_state().state == "running"
    fresh = new_kernel()
    out = fresh.execute(f"job = %distributed attach {job.id}\nprint(job.state)")
    assert out.error is None, out.error_text
    assert out.stdout.strip().splitlines()[-1] == "succeeded"
    assert "[0] done" in out.stdout or "done" in job.log_file(ProcessId("worker", 0)).read_text()


def test_line_commands_list_status_logs_stop(kernel, jobs_root):
    out = kernel.execute(
        "job = get_ipython().run_cell_magic('distributed', '--workers 2 --background --name bg',"
        ' \'import os, time\\nprint("hello from", os.environ["JUPYTER_DISTRAIN_RANK"], '
        "flush=True)\\ntime.sleep(120)\\n')\nprint(job.id)"
    )
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    wait_for(lambda: job.read_state().state == "running", 30, what="running")
    wait_for(lambda: "hello" in job.log_file(ProcessId("worker", 1)).read_text(), 30, what="output")
    out = kernel.execute("%distributed list")
    assert job.id in out.stdout and "running" in out.stdout
    out = kernel.execute(f"%distributed status {job.id}")
    assert "worker-0" in out.stdout and "worker-1" in out.stdout
    out = kernel.execute(f"%distributed logs {job.id} --rank 1")
    assert out.stdout.strip() == "hello from 1"
    out = kernel.execute(f"%distributed stop {job.id}")
    assert f"Job {job.id} stopped." in out.stdout
    assert not any(running(p) for p in job_pids(job)[:-2])  # not the warden and supervisor
    out = kernel.execute("%distributed status nosuchjob")
    assert out.error["ename"] == "UsageError" and "nosuchjob" in out.error["evalue"]
    out = kernel.execute("%distributed config")
    assert re.search(r"^stall_timeout +60\.0 +default$", out.stdout, re.M), out.stdout


def test_the_display_text_is_the_job_summary_and_ends_with_its_final_state(kernel, jobs_root):
    """What ``jupyter console`` and text exports show of the widget's display: the job's
    summary line, not the widget's repr; the display's update at the end says how the
    job ended."""
    out = kernel.execute("%%distributed --workers 2\nprint('hi')\n")
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    texts = {
        msg["msg_type"]: msg["content"]["data"]["text/plain"]
        for msg in out.messages
        if msg["msg_type"] in ("display_data", "update_display_data")
    }
    assert texts["display_data"].startswith(f"[{job.id}] ")
    assert texts["update_display_data"].startswith(f"[{job.id}] succeeded: ")
    assert "Widget" not in "".join(texts.values())


# a job of about 5 s that reports its steps: longer than the grace a front-end has to
# count its view of the widget (client/widget/frontend.py)
REPORTING_CELL = (
    "%%distributed --workers 2 --backend plain\n"
    "import time\n"
    "from jupyter_distrain import report\n"
    "for step in range(1, 13):\n"
    "    time.sleep(0.4)\n"
    "    report(step=step, images=32, total_steps=12)\n"
)


def display_texts(out: CellOutput, kind: str) -> list[str]:
    """The ``text/plain`` of the cell's display messages of this kind, in order."""
    return [m["content"]["data"]["text/plain"] for m in out.messages if m["msg_type"] == kind]


def test_without_a_widget_front_end_the_display_and_the_stream_show_progress_as_it_runs(
    kernel, jobs_root
):
    """A kernel client draws no widget, so no view is counted: the display's text is
    updated while the job runs, and summary lines reach the cell's stream (what
    ``jupyter console`` shows: it ignores display updates)."""
    out = kernel.execute(REPORTING_CELL)
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    updates = display_texts(out, "update_display_data")
    running = [t for t in updates if re.match(rf"\[{job.id}\] running: 2/2 processes up, step ", t)]
    assert len(running) >= 1, updates
    assert updates[-1].startswith(f"[{job.id}] succeeded: ")
    lines = [line for line in out.stdout.splitlines() if line.startswith(f"[{job.id}] ")]
    assert any(" running: 2/2 processes up, step " in line for line in lines), out.stdout
    assert lines[-1].startswith(f"[{job.id}] succeeded: ") and "step 12/12 (100%)" in lines[-1]


def test_a_front_end_that_draws_the_widget_gets_no_periodic_display_update(kernel, jobs_root):
    """A widget front-end counts its view (``_view_count``, as @jupyter-widgets/base does
    when a view is shown); updating the display would re-create that view, so the display
    is updated once, at the end, and no summary line is printed."""
    views = []

    def draw(msg: dict) -> None:  # what a widget front-end sends once it shows the view
        data = msg["content"].get("data", {})
        if msg["msg_type"] == "comm_open" and data.get("state", {}).get("_view_count") == 0:
            views.append(msg["content"]["comm_id"])
            update = {"method": "update", "state": {"_view_count": 1}, "buffer_paths": []}
            content = {"comm_id": views[-1], "data": update}
            kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", content))

    out = kernel.collect(kernel.submit(REPORTING_CELL), on_message=draw)
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    assert len(views) == 1
    updates = display_texts(out, "update_display_data")
    assert len(updates) == 1 and updates[0].startswith(f"[{job.id}] succeeded: "), updates
    assert f"[{job.id}] " not in out.stdout


def test_memory_limit_fails_the_job_naming_the_worker(kernel, jobs_root):
    cell = (
        "%%distributed --workers 2 --memory 0.5\n"
        "import os, time\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    hog = bytearray(800 * 2**20)\n"
        "    hog[::4096] = b'x' * len(hog[::4096])\n"
        "time.sleep(60)\n"
    )
    out = kernel.execute(cell)
    assert out.error is not None and "worker 1 exceeded 0.5 GiB" in out.error["evalue"]
    job = only_job(jobs_root)
    wait_for(lambda: not any(running(p) for p in job_pids(job)), 5, what="job processes to exit")


def test_cpu_flag_pins_each_worker(kernel):
    out = kernel.execute(
        "%%distributed --workers 2 --cpu 1\nimport os\nprint('cpus', sorted(os.sched_getaffinity(0)),"
        " os.environ['OMP_NUM_THREADS'])\n"
    )
    assert out.error is None, out.error_text
    lines = [line for line in out.stdout.splitlines() if " cpus " in line]
    assert len(lines) == 2
    for line in lines:
        cpus = json.loads(line.split("cpus ")[1].rsplit(" ", 1)[0])
        assert len(cpus) == 1 and line.endswith(" 1")


THREADS_CELL = (
    "import os\nprint('threads', os.environ.get('TF_NUM_INTRAOP_THREADS'),"
    " os.environ.get('TF_NUM_INTEROP_THREADS'))\n"
)


def test_each_of_a_hosts_processes_gets_its_share_of_the_cores_unless_told(kernel):
    def threads(flags: str) -> list[str]:
        out = kernel.execute(f"%%distributed {flags}\n{THREADS_CELL}")
        assert out.error is None, out.error_text
        return sorted(
            line.split("threads ")[1] for line in out.stdout.splitlines() if "threads " in line
        )

    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert threads("--workers 2") == [f"{share} {share}"] * 2
    assert threads("--workers 2 --env TF_NUM_INTEROP_THREADS=3") == ["None 3"] * 2
    assert threads("--workers 1") == ["None None"]


def test_job_directory_layout_is_private(kernel, jobs_root):
    out = kernel.execute("%%distributed --workers 1 --name layout\nprint('hi')\n")
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    assert job.train_file.read_text() == "print('hi')\n"
    assert job.path.stat().st_mode & 0o777 == 0o700
    assert job.control_file.stat().st_mode & 0o777 == 0o600
    assert json.loads(job.spec_file.read_text())["workers"] == 1
    kinds = [e["event"] for e in job.read_events()]
    assert kinds[0] == "state" and "launch" in kinds and "exit" in kinds
    assert job.read_state().state == "succeeded"
