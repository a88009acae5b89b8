"""Defects found by trying the engine as a hostile or careless user would; each test
failed before its fix. Real processes where a job is needed (plain Python cells, a
second or two each), none elsewhere."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.client.follow import follow
from jupyter_distrain.client.job import Job
from jupyter_distrain.client.widget import JobModel, JobWidget
from jupyter_distrain.contract.launch import ProcessSpec
from jupyter_distrain.contract.private import UnsafeJobDirectory
from jupyter_distrain.contract.process import Env, ProcessId
from jupyter_distrain.contract.status import JobStatus
from jupyter_distrain.contract.store import JobDir, find_job_dir, list_job_dirs
from jupyter_distrain.launchers.local import LocalLauncher

W0 = ProcessId("worker", 0)


def _pid_reused(pid: int) -> subprocess.Popen:
    """Start a process that gets ``pid`` (as root: through ns_last_pid)."""
    for _ in range(20):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"could not get pid {pid} again")


@pytest.mark.root  # the pid is reused by writing /proc/sys/kernel/ns_last_pid
def test_a_signal_never_reaches_a_process_that_reused_a_pid(jobs_root, tmp_path):
    job = JobDir.create(JobSpec(code="", name="reuse"))
    launcher = LocalLauncher(job.read_spec(), job)
    handle = launcher.start(ProcessSpec(W0, [sys.executable, "-c", "pass"], {}), tmp_path / "log")
    assert handle.wait() == 0  # exited and reaped: its pid is free
    stranger = _pid_reused(handle.pid)
    try:
        handle.signal(signal.SIGKILL, tree=True)  # what the end of a job does to every pid
        handle.signal(signal.SIGUSR1)
        time.sleep(0.2)
        assert stranger.poll() is None, "an unrelated process was killed"
        assert handle.memory_bytes() == 0
    finally:
        stranger.kill()
        stranger.wait()


def test_a_hello_is_adopted_only_from_a_descendant_of_a_process_the_launcher_started(
    jobs_root, tmp_path
):
    """A hello names its pid; an adopted pid is signalled at every stop. A pid that is not
    under one of the job's processes (mpirun) was adopted all the same: any holder of
    the job's secret could have had the job kill a stranger."""
    job = JobDir.create(JobSpec(code="", name="adopt"))
    launcher = LocalLauncher(job.read_spec(), job)
    code = "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    helper = launcher.start(ProcessSpec(W0, [sys.executable, "-c", code], {}), tmp_path / "log")
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        wait_for(lambda: helper.process.children(), 10, what="the helper's child")
        (child,) = helper.process.children()
        assert launcher.adopt(stranger.pid, "localhost") is None
        assert launcher.adopt(os.getpid(), "localhost") is None
        assert launcher.adopt(child.pid, "localhost").pid == child.pid
    finally:
        helper.signal(signal.SIGKILL, tree=True)
        helper.wait()
        stranger.kill()
        stranger.wait()


def test_an_unsafe_jobs_root_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(Env.ROOT, str(shared))
    with pytest.raises(UnsafeJobDirectory, match="writable by others"):
        submit(JobSpec(code="pass\n"))
    shared.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)
        foreign, owner = shared, 65534
    else:  # an ordinary account cannot give a folder away: one of root's
        foreign, owner = Path("/usr"), 0
    monkeypatch.setenv(Env.ROOT, str(foreign))
    with pytest.raises(UnsafeJobDirectory, match=f"belongs to uid {owner}"):
        submit(JobSpec(code="pass\n"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    monkeypatch.setenv(Env.ROOT, str(link))
    with pytest.raises(UnsafeJobDirectory, match="symlink"):
        list_job_dirs()


def test_job_ids_cannot_walk_out_of_the_root_and_foreign_job_dirs_are_ignored(jobs_root):
    with pytest.raises(KeyError, match="not a job id"):
        find_job_dir("../x")
    job = JobDir.create(JobSpec(code="", name="mine"))
    job.path.chmod(0o755)
    assert list_job_dirs() == []
    with pytest.raises(KeyError):
        find_job_dir(job.id)


def test_a_worker_refuses_a_job_directory_that_is_not_private(jobs_root):
    job = JobDir.create(JobSpec(code="print('ran')\n", name="open"))
    job.path.chmod(0o755)
    env = {**os.environ, Env.JOB_DIR: str(job.path)}
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_distrain.worker"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and "not private" in out.stderr and "ran" not in out.stdout
    with pytest.raises(UnsafeJobDirectory):
        Job(job).result()


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"workers": 10_000_000}, "--workers 10000000: the job needs 10000000 processes"),
        ({"workers": 3, "cpu": 3.0 * len(os.sched_getaffinity(0))}, "processes need"),
        ({"workers": 2, "memory": 60_000.0}, "--memory 60000: 2 processes need"),
        ({"workers": 2, "ps": 100}, "--workers 2 --ps 100"),
    ],
)
def test_requests_beyond_the_machine_are_refused_before_anything_starts(jobs_root, fields, flag):
    with pytest.raises(SpecError, match=flag.replace("(", r"\(")):
        submit(JobSpec(code="pass\n", backend="plain" if "ps" not in fields else "ps", **fields))
    assert list_job_dirs(jobs_root) == []


def test_an_exit_code_outside_0_to_255_is_a_failure_not_a_success(jobs_root):
    job = submit(JobSpec(code="import sys\nsys.exit(256)\n", workers=1, backend="plain"))
    wait_for(lambda: job.status().done, 30, what="the end")
    status = job.status()
    assert status.state == "failed" and status.processes[0].exit_code == 1
    assert "out of range" in job.logs(W0)


def test_the_job_secret_is_not_in_the_workers_environment(jobs_root):
    code = "import os\nprint(sorted(os.environ.items()))\n"
    job = submit(JobSpec(code=code, workers=1, backend="plain"))
    assert job.wait(timeout=30) == "succeeded"
    secret = job.dir.read_control().secret
    text = job.logs(W0)
    assert "JUPYTER_DISTRAIN_JOB_DIR" in text and secret not in text and "SECRET" not in text


HANDED_READER = """\
import os, subprocess, sys
from jupyter_distrain.contract.process import WorkerChannels
from jupyter_distrain.contract.store import JobDir
channels = WorkerChannels.from_env()
print(channels.secret, JobDir(channels.job_dir).read_pushed())
print("again", WorkerChannels.from_env().secret)  # read once, the same after
print("child sees", subprocess.run([sys.executable, "-c", "import os; print(sorted(os.environ))"],
      capture_output=True, text=True).stdout.count("HANDOFF"), os.environ.get("JUPYTER_DISTRAIN_HANDOFF_FD"))
"""


def test_what_the_agent_hands_a_process_in_memory_is_read_once_and_not_inherited(tmp_path):
    """The host agent's ``handoff`` (what a Ray node's process gets instead of the
    ``control`` and ``push.pkl`` files): the process reads the secret and the pushed
    values from the memory file, with no such file in its job directory; its own
    children see neither the descriptor's name nor the descriptor."""
    import pickle

    from jupyter_distrain.contract.handoff import Handoff
    from jupyter_distrain.launchers.agent.client import AgentClient

    job = tmp_path / "slot"
    job.mkdir(mode=0o700)
    handed = Handoff("handed-secret", pickle.dumps({"lr": 0.5})).fields()
    request = {"argv": [sys.executable, "-c", HANDED_READER], "env": {Env.JOB_DIR: str(job)}}
    agent = subprocess.Popen(
        [sys.executable, "-m", "jupyter_distrain.launchers.agent", "run", str(job)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    client = AgentClient(agent.stdin, agent.stderr, {**request, "handoff": handed})
    assert client.wait_ended(60) and client.outcome() == 0, client.said("")
    lines = agent.stdout.read().decode().splitlines()
    agent.wait(10)
    assert lines == ["handed-secret {'lr': 0.5}", "again handed-secret", "child sees 0 None"]
    assert sorted(p.name for p in job.iterdir()) == []  # no control, no push.pkl
    # a session's later cells went to memory while it ran: gone with it, link and all
    assert list(Path("/dev/shm").glob(f"jupyter_distrain-cells-{os.getuid()}-{agent.pid}-*")) == []


def test_one_corrupt_state_file_breaks_no_listing(jobs_root):
    good = JobDir.create(JobSpec(code="", name="good"))
    bad = JobDir.create(JobSpec(code="", name="bad"))
    bad.state_file.write_text("{not json")
    states = {Job(d).id: Job(d).status().state for d in list_job_dirs()}
    assert states == {good.id: "pending", bad.id: "unknown"}
    assert Job(bad).status().error.startswith("state.json is unreadable")


def test_strange_metrics_and_markup_do_not_break_the_widget(jobs_root):
    job = JobDir.create(JobSpec(code="", name="odd"))
    row = {"role": "<b>worker</b>", "index": 0, "host": "<script>x</script>", "state": "running"}
    job.write_state(JobStatus(state="running", processes=[], created=time.time()))
    status = JobStatus.from_dict({"state": "running", "processes": [row], "created": 1.0})
    job.write_state(status)
    records = [
        {"role": "worker", "index": 0, "step": "abc", "images_per_sec": 5},
        {"role": "worker", "index": 0, "step": 1, "images_per_sec": "fast", "time": "now"},
        {"role": "worker", "index": 0, "step": 2, "images_per_sec": float("nan")},
        {"role": "<i>x</i>", "index": 0, "step": 3, "images_per_sec": 7.0, "total_steps": "n"},
        [1, 2],
        "text",
    ]
    job.metrics_file.write_text("\n".join(json.dumps(r) for r in records) + "\n{bad\n")
    model = JobModel(Job(job))
    model.update()
    assert dict(model.series) == {"<i>x</i>-0": model.series["<i>x</i>-0"]}
    widget = JobWidget(Job(job))
    html = widget.table.value + widget.chart.value + widget.header.value
    assert "<script>" not in html and "<b>worker</b>" not in html and "<i>x</i>" not in html
    assert "&lt;script&gt;" in html


def test_a_view_that_raises_does_not_end_the_wait(jobs_root, capsys):
    class Broken:
        def refresh(self, force=False, status=None):
            raise ZeroDivisionError("boom")

    job = submit(JobSpec(code="import time\ntime.sleep(1)\n", workers=1, backend="plain"))
    assert follow(job, Broken(), out=io.StringIO()) == "succeeded"
    assert "the job's view failed" in capsys.readouterr().err


def test_one_damaged_spec_file_breaks_no_listing(jobs_root):
    # list and GET /distrain/jobs built every job's line from its spec: one bad file
    # (or one written by someone else) failed the whole listing
    from jupyter_distrain.server.models import job_model

    good = JobDir.create(JobSpec(code="", name="good"))
    for text in ("[]", '{"workers": {"x": 1}, "launcher_options": 3}', "{not json"):
        bad = JobDir.create(JobSpec(code="", name="bad"))
        bad.spec_file.write_text(text)
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter_distrain.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "JUPYTER_DISTRAIN_ROOT": str(jobs_root)},
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 4 and sum(" unknown " in line for line in lines) == 3
    assert any(line.startswith(good.id) and " pending " in line for line in lines)
    models = [job_model(Job(d)) for d in list_job_dirs()]
    assert sorted(m["state"] for m in models) == ["pending", "unknown", "unknown", "unknown"]
    assert all("spec.json is unreadable" in m["error"] for m in models if m["state"] == "unknown")


def test_a_job_whose_submit_was_interrupted_says_so_and_can_be_cleaned(jobs_root, monkeypatch):
    # the job directory was made but no supervisor ever took its lock: it stayed "pending"
    # for ever, clean skipped it and stop waited out its timeout
    from jupyter_distrain.client import api
    from jupyter_distrain.client.retention import clean

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "start_supervisor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        submit(JobSpec(code="print(1)\n", name="cut", pool=False))
    (cut,) = list_job_dirs()
    status = Job(cut).status()
    assert status.state == "failed" and "submit was interrupted" in status.error
    # a kernel killed in the middle writes nothing: the store says so once the submit is old
    killed = JobDir.create(JobSpec(code="", name="killed"))
    assert Job(killed).status().state == "pending"  # a submit under way
    old = time.time() - 120
    os.utime(killed.spec_file, (old, old))
    assert Job(killed).status().state == "failed"
    started = time.monotonic()
    assert Job(killed).stop() == "failed" and time.monotonic() - started < 5
    assert sorted(clean()) == sorted([cut.id, killed.id])
