"""The seed's API (launch_workers, await_workers, stop_workers, run_cluster), and bad input
for the new backends. Real processes and real TensorFlow servers."""

from __future__ import annotations

import sys

import pytest
from conftest import running, wait_for

from jupyter_distrain import (
    JobSpec,
    await_workers,
    launch_workers,
    run_cluster,
    stop_workers,
    submit,
)
from jupyter_distrain.client.job import Job, JobFailed
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import SpecError
from jupyter_distrain.contract.store import list_job_dirs


def test_await_workers_reports_running_workers_and_failures(jobs_root, tmp_path):
    good = launch_workers(2, code="import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    bad = launch_workers(1, script=str(tmp_path / "no_such_train.py"))
    ids = [w["id"] for w in good + bad]
    assert all(isinstance(w["id"], str) for w in good + bad)
    running_workers = await_workers(ids, wait_for_completion=False, timeout_seconds=20)
    assert running_workers["failures"] == [bad[0]["id"]]
    assert [w["id"] for w in running_workers["workers"]] == [good[0]["id"], good[1]["id"]]
    assert all(w["ip_address"] == "127.0.0.1" for w in running_workers["workers"])
    job = Job.attach(good[0]["job"])
    pids = job.pids()
    stopped = stop_workers([w["id"] for w in good])
    assert [w["state"] for w in stopped] == ["killed", "killed"]
    assert job.state == "stopped"
    wait_for(lambda: not any(running(p) for p in pids), 5, what="workers gone")
    assert "No such file" in Job.attach(bad[0]["job"]).logs(ProcessId("worker", 0))


def test_await_workers_for_completion(jobs_root, tmp_path):
    script = tmp_path / "work.py"
    script.write_text("import os, sys\nsys.exit(int(os.environ['JUPYTER_DISTRAIN_RANK']))\n")
    workers = launch_workers(2, script=str(script))
    done = await_workers([w["id"] for w in workers], wait_for_completion=True, timeout_seconds=30)
    assert [w["id"] for w in done["workers"]] == [workers[0]["id"]]
    assert done["failures"] == [workers[1]["id"]]


def test_stopping_one_worker_leaves_the_others_running(jobs_root):
    workers = launch_workers(2, code="import time\ntime.sleep(60)\n")
    ids = [w["id"] for w in workers]
    assert not await_workers(ids, timeout_seconds=20)["failures"]
    stop_workers(ids[1])
    job = Job.attach(workers[0]["job"])
    procs = {p.index: p for p in job.status().processes}
    assert procs[1].state == "killed" and procs[0].state == "running"
    assert job.state == "running"
    stop_workers(ids[0])
    wait_for(lambda: job.state == "stopped", 10, what="stopped")


def test_run_cluster_starts_the_seed_program_and_returns_its_addresses(jobs_root, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import tensorflow as tf\n"
        "def run(cluster, server, task_index):\n"
        "    with tf.compat.v1.Session(server.target) as sess:\n"
        "        print('task', task_index, 'sees', sess.run(tf.constant(41) + 1), flush=True)\n"
    )
    cluster, session_addr = run_cluster(
        n_workers=2, n_ps=1, cpu=1, memory=2, worker_script=str(script), timeout_seconds=60
    )
    assert len(cluster["worker"]) == 2 and len(cluster["ps"]) == 1
    assert session_addr == f"grpc://{cluster['worker'][0]}"
    job = Job.attach(list_job_dirs(jobs_root)[0].id)
    assert job.wait(timeout=120) == "succeeded"
    assert "task 0 sees 42" in job.logs(ProcessId("worker", 0))


def test_run_cluster_rejects_a_script_without_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('no run here')\n")
    with pytest.raises(SpecError, match="does not define run"):
        run_cluster(n_workers=1, n_ps=1, worker_script=str(script))
    with pytest.raises(SpecError, match="cannot read"):
        run_cluster(n_workers=1, n_ps=1, worker_script=str(tmp_path / "missing.py"))


def test_api_and_magic_make_the_same_job_directory(kernel, jobs_root):
    out = kernel.execute(
        "%%distributed --workers 1 --backend plain --name via-magic\nprint('hi')\n"
    )
    assert out.error is None, out.error_text
    workers = launch_workers(1, code="print('hi')\n", name="via-api")
    done = await_workers([workers[0]["id"]], wait_for_completion=True, timeout_seconds=30)
    assert not done["failures"]
    wait_for(lambda: Job.attach(workers[0]["job"]).done, 10, what="done")
    jobs = list_job_dirs(jobs_root)
    wait_for(lambda: all(j.supervisor_alive() is False for j in jobs), 10, what="supervisors gone")
    layouts = []
    for job in list_job_dirs(jobs_root):
        layouts.append(sorted(str(p.relative_to(job.path)) for p in job.path.rglob("*")))
    assert len(layouts) == 2 and layouts[0] == layouts[1], layouts


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("--ps 2 --backend horovod", "--ps"),
        ("--backend ps", "--backend ps needs --ps"),
        ("--ps 1 --workers 0", "--workers"),
        ("--ps -1", "--ps"),
    ],
)
def test_bad_backend_flags_give_one_line_and_launch_nothing(kernel, jobs_root, flags, expected):
    out = kernel.execute(f"%%distributed {flags}\nprint('never')\n")
    assert out.error is not None and out.error["ename"] == "UsageError"
    assert expected in out.error["evalue"] and "\n" not in out.error["evalue"].strip()
    assert list_job_dirs(jobs_root) == []


@pytest.mark.horovod
def test_auto_backend_says_what_it_chose_and_why(kernel):
    out = kernel.execute("%%distributed --workers 1\nprint('ok')\n")
    assert out.error is None, out.error_text
    assert "backend horovod/gloo (horovod is installed with TensorFlow support)" in out.stdout


def test_startup_timeout_names_the_processes_that_did_not_come_up(jobs_root, tmp_path):
    slow_python = tmp_path / "slow-python"
    slow_python.write_text(f'#!/bin/sh\nsleep 60\nexec {sys.executable} "$@"\n')
    slow_python.chmod(0o755)
    job = submit(
        JobSpec(
            code="print('never')\n",
            workers=1,
            ps=1,
            backend="ps",
            timeout=2,
            python=str(slow_python),
        )
    )
    with pytest.raises(JobFailed) as failure:
        job.wait(timeout=60)
    message = str(failure.value)
    assert "startup timeout" in message
    assert "chief-0" in message and "worker-0" in message and "ps-0" in message
    wait_for(lambda: not any(running(p) for p in job.pids()), 10, what="processes gone")


def test_a_seed_chief_waits_for_a_worker_whose_server_starts_late(jobs_root, tmp_path):
    # with gRPC's fail-fast (right for ParameterServerStrategy) the chief's TF1 session
    # failed at once on a worker still starting: "failed to connect to all addresses"
    script = tmp_path / "train.py"
    script.write_text(
        "import os, time\n"
        "import tensorflow as tf\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    time.sleep(4)  # this worker's server starts 4 s after the others\n"
        "def run(cluster, server, task_index):\n"
        "    with tf.compat.v1.Session(server.target) as sess:\n"
        "        print('task', task_index, 'sees', sess.run(tf.constant(41) + 1), flush=True)\n"
    )
    cluster, _ = run_cluster(n_workers=2, n_ps=1, worker_script=str(script), timeout_seconds=60)
    job = Job.attach(list_job_dirs(jobs_root)[0].id)
    assert job.wait(timeout=120) == "succeeded"
    assert "task 0 sees 42" in job.logs(ProcessId("worker", 0))
