"""``jupyter-distrain`` from a terminal, as a script would use it: the installed command
in a subprocess, against real jobs (plain Python ranks), read by its output and its
exit status: list, status, logs (and ``--follow`` until the job ends), stacks, stop (every
process gone), scale refused, attach's text view, clean, pool; bad input is one line
and exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
from conftest import STACKS_PROGRAM, wait_for, wait_until_up

from jupyter_distrain import JobSpec, submit

CLI = str(Path(sys.executable).with_name("jupyter-distrain"))
TICKS = """\
import os, time
for i in range(int(os.environ.get("TICKS", "3"))):
    print(f"rank {os.environ['JUPYTER_DISTRAIN_RANK']} tick {i}", flush=True)
    time.sleep(0.5)
"""
FAILS = 'import os, sys\nsys.exit(3 if os.environ["JUPYTER_DISTRAIN_RANK"] == "1" else 0)\n'


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_list_status_and_logs_of_a_finished_job():
    job = submit(JobSpec(code=TICKS, workers=2, backend="plain"))
    assert job.wait(60) == "succeeded"
    listed = cli("list")
    assert listed.returncode == 0
    assert listed.stdout.split()[:3] == [job.id, "succeeded", "2"]
    status = cli("status", job.id)
    assert status.returncode == 0
    assert [line.split()[0] for line in status.stdout.splitlines()[1:]] == ["worker-0", "worker-1"]
    one = cli("logs", job.id, "--rank", "1")
    assert one.stdout.split("\n")[:3] == ["rank 1 tick 0", "rank 1 tick 1", "rank 1 tick 2"]
    every = cli("logs", job.id).stdout.splitlines()
    assert "[0] rank 0 tick 2" in every and "[1] rank 1 tick 2" in every


def test_logs_follow_prints_the_new_lines_until_the_job_ends():
    job = submit(JobSpec(code=TICKS, workers=2, backend="plain", env={"TICKS": "6"}))
    wait_for(lambda: job.state == "running", 60, what="running")
    followed = cli("logs", job.id, "--rank", "0", "--follow")
    assert followed.returncode == 0
    assert [line for line in followed.stdout.splitlines() if "tick" in line] == [
        f"[0] rank 0 tick {i}" for i in range(6)
    ]
    assert job.done  # it returned because the job ended


def test_a_failed_job_is_exit_status_1_for_status_and_attach():
    job = submit(JobSpec(code=FAILS, workers=2, backend="plain"))
    wait_for(lambda: job.done, 60, what="the end")
    status = cli("status", job.id)
    assert status.returncode == 1
    assert "error: " in status.stdout
    attached = cli("attach", job.id)
    assert attached.returncode == 1
    assert attached.stdout.startswith(f"Attached to job {job.id} (failed).")


def test_attach_follows_a_running_job_in_text_and_stop_leaves_nothing():
    job = submit(JobSpec(code=TICKS, workers=2, backend="plain", env={"TICKS": "4"}))
    wait_for(lambda: job.state == "running", 60, what="running")
    attached = cli("attach", job.id)
    assert attached.returncode == 0
    out = attached.stdout
    assert f"[{job.id}] succeeded: " in out  # the text view's last line
    # each rank's last lines come first: the ticks already printed when the CLI started
    # (late under load) are not missed
    assert "[1] rank 1 tick 3" in out
    again = cli("attach", job.id).stdout  # an ended job: its last lines, then its end
    assert again.startswith(f"Attached to job {job.id} (succeeded).\n"), again
    assert "[0] rank 0 tick 0" in again and "[1] rank 1 tick 3" in again
    sleeper = submit(JobSpec(code="import time\ntime.sleep(600)\n", workers=2, backend="plain"))
    wait_for(lambda: sleeper.state == "running", 60, what="running")
    pids = sleeper.pids()
    stopped = cli("stop", sleeper.id)
    assert (stopped.returncode, stopped.stdout) == (0, f"Job {sleeper.id} stopped.\n")
    # the workers are gone when stop returns; the supervisor and its warden a moment later
    assert not [p.pid for p in sleeper.status().processes if psutil.pid_exists(p.pid)]
    wait_for(lambda: not [pid for pid in pids if psutil.pid_exists(pid)], 10, what="all gone")


def test_stacks_of_a_running_job_grouped_as_json_and_of_one_that_ended():
    job = submit(JobSpec(code=STACKS_PROGRAM, workers=3, backend="plain", grace=1))
    wait_until_up(job, 3)
    shown = cli("stacks", job.id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1] == "  rank 1: train.py:6 in load_batch  time.sleep(300)"
    model = json.loads(cli("stacks", job.id, "--json").stdout)
    assert [g["names"] for g in model["groups"]] == [["rank 1"], ["rank 0", "rank 2"]]
    assert model["odd_ones_out"] == ["rank 1"] and model["reason"] == "request"
    native = cli("stacks", job.id, "--native", timeout=90)
    assert native.returncode == 0, native.stderr
    (rank1,) = re.findall(r"rank 1, native \(py-spy\):\n((?:        .*\n)+)", native.stdout)
    assert re.search(r"^        Thread \d+ \(idle\): \"MainThread\"$", rank1, re.M), rank1
    assert re.search(r"^ +load_batch \(.*train\.py:6\)$", rank1, re.M), rank1
    assert job.state == "running"
    job.stop()
    ended = cli("stacks", job.id)
    assert ended.returncode == 0
    assert ended.stdout.startswith(f"Job {job.id} has ended (stopped); the last stacks taken")


def test_bad_input_is_one_line_and_exit_status_2():
    job = submit(JobSpec(code="pass\n", workers=1, backend="plain"))
    job.wait(60)
    for args, said in (
        (("status", "job-nosuch"), "job-nosuch"),
        (("logs", job.id, "--rank", "7"), "has no log for worker 7"),
        (("scale", job.id, "2"), f"cannot scale {job.id}"),
        (("stacks", job.id), f"job {job.id} has ended (succeeded); no stacks were taken"),
        (("clean", "--keep", "-1"), "jupyter-distrain clean: --keep and --older-than"),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done)
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert said in done.stderr
    assert cli("scale", job.id, "two").returncode == 2  # argparse's own usage error


def test_clean_and_pool():
    done = submit(JobSpec(code="pass\n", workers=1, backend="plain"))
    done.wait(60)
    wait_for(lambda: cli("clean").stdout.startswith("removed 1 finished job(s)"), 30, 1, "clean")
    assert cli("list").stdout == "no jobs\n"
    pools = cli("pool")
    assert pools.returncode == 0 and pools.stdout.startswith("no warm pools")
