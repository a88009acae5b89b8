"""The job store's retention rule and ``%distributed clean``: finished jobs go, by count
and by age; a running job is never removed, whatever the rule says. Real jobs."""

from __future__ import annotations

import dataclasses
import os
import time

import psutil
import pytest
from conftest import wait_for
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.client import retention
from jupyter_distrain.client.magics import DistributedMagics
from jupyter_distrain.contract.store import list_job_dirs

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _finished(name: str):
    job = submit(JobSpec(code="print('done')", workers=1, backend="plain", name=name))
    assert job.wait(60) == "succeeded"
    return job


def _running():
    job = submit(JobSpec(code=SLEEPER, workers=1, backend="plain", grace=1))
    deadline = time.monotonic() + 60
    while job.state != "running":
        assert time.monotonic() < deadline and not job.done
        time.sleep(0.1)
    return job


def _ids() -> set[str]:
    return {d.id for d in list_job_dirs()}


def test_submit_keeps_the_newest_finished_jobs_and_every_running_one(monkeypatch):
    monkeypatch.setenv("JUPYTER_DISTRAIN_KEEP_JOBS", "2")
    sleeper = _running()
    first, second, third = (_finished(f"f{i}") for i in range(3))
    assert _ids() == {sleeper.id, first.id, second.id, third.id}  # 2 finished at each submit
    wait_for(lambda: third.dir.supervisor_alive() is False, 10, what="the supervisor gone")
    fourth = _finished("f3")
    assert _ids() == {sleeper.id, second.id, third.id, fourth.id}  # first: the third finished
    assert sleeper.state == "running"
    assert all(psutil.pid_exists(p.pid) for p in sleeper.status().processes)
    sleeper.stop()


def test_finished_jobs_older_than_the_limit_go_at_the_next_submit(monkeypatch):
    old = _finished("old")
    # its supervisor may write the state once more on its way out: only then age it
    wait_for(lambda: old.dir.supervisor_alive() is False, 10, what="the supervisor gone")
    status = old.dir.read_state()
    old.dir.write_state(dataclasses.replace(status, ended=time.time() - 31 * 86400))
    recent = _finished("recent")
    assert old.id not in _ids() and recent.id in _ids()


def test_a_bad_setting_is_one_warning_and_the_default(caplog):
    rule = retention.Retention.from_env({"JUPYTER_DISTRAIN_KEEP_JOBS": "lots"})
    assert rule.keep_jobs == retention.DEFAULT_KEEP_JOBS
    assert "JUPYTER_DISTRAIN_KEEP_JOBS='lots' is not a number" in caplog.text
    assert retention.Retention.from_env({"JUPYTER_DISTRAIN_KEEP_DAYS": "inf"}).keep_days == float(
        "inf"
    )


def test_clean_removes_finished_jobs_never_a_running_one(capsys):
    magics = DistributedMagics(shell=InteractiveShell.instance())
    sleeper = _running()
    done = [_finished(f"c{i}") for i in range(3)]
    with pytest.raises(UsageError, match=f"{sleeper.id} not finished: stop it first"):
        magics._line_command(f"clean {done[0].id} {sleeper.id}")
    assert _ids() == {sleeper.id, *(j.id for j in done)}  # all or none
    magics._line_command("clean --keep 1")
    assert _ids() == {sleeper.id, done[2].id}
    assert "removed 2 finished job(s)" in capsys.readouterr().out
    magics._line_command(f"clean {done[2].id}")
    assert _ids() == {sleeper.id}
    magics._line_command("clean")
    assert "no finished job to remove" in capsys.readouterr().out
    assert sleeper.state == "running"
    sleeper.stop()
    magics._line_command("clean")
    assert _ids() == set()


def test_a_lost_job_of_another_launcher_is_not_kept_by_a_local_pid_that_matches():
    job = _finished("lost")
    wait_for(lambda: job.dir.supervisor_alive() is False, 10, what="the supervisor gone")
    status = job.dir.read_state()
    rows = [dataclasses.replace(p, state="running", pid=os.getpid()) for p in status.processes]
    # an ssh job whose supervisor died mid-run: its pids are the hosts', one matching ours
    job.dir.write_state(
        dataclasses.replace(status, state="running", launcher="ssh", processes=rows, ended=None)
    )
    assert retention.finished_at(job.dir) is not None
    local = dataclasses.replace(job.dir.read_state(), launcher="local")
    job.dir.write_state(local)
    assert retention.finished_at(job.dir) is None  # here a live pid may be the job's
