"""The server extension's REST API, in a real Jupyter server (pytest-jupyter), against
jobs that really ran: every route, authentication, XSRF, and bad requests; all under
a JupyterHub user's base URL (``/user/alice/``); a running job is the server's
activity for jupyter_server (what a hub's idle culler reads), the routes' reads are
not."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import subprocess
import sys
import time
import urllib.parse

import psutil
import pytest
from conftest import STACKS_PROGRAM, wait_for, wait_until_up
from jupyter_server.auth.authorizer import AllowAllAuthorizer
from tornado.httpclient import HTTPClientError

from jupyter_distrain.client import api
from jupyter_distrain.client.flags import flag_models
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.spec import JobSpec
from jupyter_distrain.contract.store import JobDir
from jupyter_distrain.server.handlers import MAX_READ_BYTES, _lines_after

pytest_plugins = ["pytest_jupyter.jupyter_server"]
ACTIVITY_SECONDS = 0.3

REPORTING = """\
import time
from jupyter_distrain import report
for step in range(1, 6):
    print(f"line {step}", flush=True)
    report(step=step, images=32, seconds=0.01, loss=1.0 / step)
time.sleep(0.5)
"""

CHECKPOINTING = """\
import sys, time
from jupyter_distrain import CHECKPOINT_EXIT, should_checkpoint
print("up", flush=True)
for _ in range(600):
    if should_checkpoint():
        sys.exit(CHECKPOINT_EXIT)
    time.sleep(0.1)
"""


class RecordingAuthorizer(AllowAllAuthorizer):
    """Jupyter's allow-all authorizer that records what it is asked about the extension's
    resource, and refuses ``write`` on it while ``read_only`` is set (a real authorizer
    class, loaded by the server from its config)."""

    read_only = False
    no_execute = False  # refuses ``execute`` (native stacks) while set
    asked: list[tuple[str, str]] = []

    def is_authorized(self, handler, user, action, resource) -> bool:
        if resource == "distrain":
            self.asked.append((handler.request.method, action))
            if action == "write" and RecordingAuthorizer.read_only:
                return False
            if action == "execute" and RecordingAuthorizer.no_execute:
                return False
        return True


@pytest.fixture
def jp_base_url() -> str:
    return "/user/alice/"  # as JupyterHub serves a user's server


@pytest.fixture
def jp_server_config(monkeypatch):
    monkeypatch.setenv("JUPYTER_DISTRAIN_ACTIVITY_SECONDS", str(ACTIVITY_SECONDS))
    RecordingAuthorizer.read_only = False
    RecordingAuthorizer.no_execute = False
    RecordingAuthorizer.asked.clear()
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_distrain": True},
            "authorizer_class": RecordingAuthorizer,
        }
    }


def _json(response) -> dict:
    return json.loads(response.body)


async def _error(fetch, *parts, **kwargs) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as failed:
        await fetch(*parts, **kwargs)
    body = failed.value.response.body if failed.value.response is not None else b""
    message = json.loads(body).get("message", "") if body.startswith(b"{") else ""
    return failed.value.code, message


def _finished_job() -> Job:
    """A job that succeeded, its supervisor gone: state.json is written for the last time
    (a final state is saved once more after it, with the last metrics)."""
    job = api.submit(JobSpec(code=REPORTING, workers=2, backend="plain"))
    assert job.wait(60) == "succeeded"
    wait_for(lambda: job.dir.supervisor_alive() is False, 15, what="the supervisor to end")
    return job


def _running_job(code: str = CHECKPOINTING) -> Job:
    job = api.submit(JobSpec(code=code, workers=2, backend="plain", grace=2))
    deadline = time.monotonic() + 60
    while job.state != "running":
        assert time.monotonic() < deadline and not job.done, job.status().error
        time.sleep(0.1)
    return job


async def test_jobs_logs_and_metrics_of_a_job_that_ran(jp_fetch):
    job = _finished_job()
    listed = _json(await jp_fetch("distrain", "jobs"))["jobs"]
    assert [j["id"] for j in listed] == [job.id]
    # the list polled by the sidebar carries no process models: a job's own model does
    assert "processes" not in listed[0] and listed[0]["process_count"] == 2
    model = _json(await jp_fetch("distrain", "jobs", job.id))
    assert model["state"] == "succeeded" and model["workers"] == 2
    assert model["backend"] == "plain" and model["launcher"] == "local"
    assert [p["id"] for p in model["processes"]] == ["worker-0", "worker-1"]
    assert all(p["exit_code"] == 0 and p["step"] == 5 for p in model["processes"])

    logs = _json(await jp_fetch("distrain", "jobs", job.id, "logs", params={"tail": 2}))
    assert logs["process"] == "worker-0" and logs["processes"] == ["worker-0", "worker-1"]
    assert logs["lines"] == ["line 4", "line 5"]
    # incremental: from an offset, then nothing new from the offset it answered
    first = _json(
        await jp_fetch(
            "distrain", "jobs", job.id, "logs", params={"process": "worker-1", "offset": 0}
        )
    )
    assert first["lines"] == [f"line {i}" for i in range(1, 6)]
    again = await jp_fetch(
        "distrain",
        "jobs",
        job.id,
        "logs",
        params={"process": "worker-1", "offset": first["offset"]},
    )
    assert _json(again)["lines"] == []

    metrics = _json(await jp_fetch("distrain", "jobs", job.id, "metrics"))
    steps = sorted((r["index"], r["step"]) for r in metrics["records"] if "step" in r)
    assert steps == [(i, s) for i in (0, 1) for s in range(1, 6)]
    later = await jp_fetch(
        "distrain", "jobs", job.id, "metrics", params={"since": metrics["since"]}
    )
    assert _json(later)["records"] == []


async def test_patch_scales_a_running_job_and_delete_stops_it(jp_fetch):
    job = _running_job()
    scaled = await jp_fetch(
        "distrain", "jobs", job.id, method="PATCH", body=json.dumps({"workers": 3})
    )
    assert scaled.code == 200
    deadline = time.monotonic() + 60
    while not (job.status().generation == 1 and job.state == "running"):
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.2)
    model = _json(await jp_fetch("distrain", "jobs", job.id))
    assert model["workers"] == 3 and model["workers_up"] == 3
    pids = [p["pid"] for p in model["processes"]]

    stopped = await jp_fetch("distrain", "jobs", job.id, method="DELETE")
    assert stopped.code == 202
    deadline = time.monotonic() + 30
    while job.state != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert not [p for p in pids if psutil.pid_exists(p)]
    code, message = await _error(
        jp_fetch, "distrain", "jobs", job.id, method="PATCH", body=json.dumps({"workers": 2})
    )
    assert code == 409 and "has ended" in message


async def test_stacks_of_a_running_job_grouped_then_the_kept_ones_once_it_ended(jp_fetch):
    """A POST takes them (each process is signalled); a GET reads the last ones kept and
    signals nothing; native frames (py-spy attached) need the execute permission."""
    job = api.submit(JobSpec(code=STACKS_PROGRAM, workers=3, backend="plain", grace=1))
    wait_until_up(job, 3)
    stacks = ("distrain", "jobs", job.id, "stacks")
    code, message = await _error(jp_fetch, *stacks)
    assert code == 404 and "were taken yet: POST to take them" in message
    assert job.kept_stacks() == [] and not [
        e for e in job.dir.read_events() if e["event"] == "stacks"
    ]
    RecordingAuthorizer.no_execute = True
    code, message = await _error(
        jp_fetch, *stacks, method="POST", body=json.dumps({"native": True})
    )
    assert code == 403 and "execute" in message and job.kept_stacks() == []
    assert ("POST", "execute") in RecordingAuthorizer.asked
    code, _ = await _error(jp_fetch, *stacks, method="POST", body=json.dumps({"native": 1}))
    assert code == 400
    model = _json(await jp_fetch(*stacks, method="POST", body=json.dumps({})))
    assert model["kept"] is False and model["odd_ones_out"] == ["rank 1"]
    assert [g["headline"] for g in model["groups"]] == [
        "rank 1: train.py:6 in load_batch  time.sleep(300)",
        "ranks 0, 2: train.py:4 in wait_for_peers  time.sleep(300)",
    ]
    assert model["text"].splitlines()[1] == "  " + model["groups"][0]["headline"]
    assert job.state == "running"
    read = _json(await jp_fetch(*stacks))
    assert read["kept"] is True and read["taken"] == model["taken"]
    job.stop()
    kept = _json(await jp_fetch(*stacks, method="POST", body=json.dumps({"native": False})))
    assert kept["kept"] is True and kept["taken"] == model["taken"]
    done = _finished_job()
    code, message = await _error(
        jp_fetch, "distrain", "jobs", done.id, "stacks", method="POST", body="{}"
    )
    assert code == 404 and "no stacks were taken while it ran" in message


async def test_bad_requests_get_a_message(jp_fetch):
    job = _finished_job()
    assert await _error(jp_fetch, "distrain", "jobs", "no-such-job") == (
        404,
        "no job 'no-such-job'",
    )
    assert (await _error(jp_fetch, "distrain", "jobs", "..", "logs"))[0] == 404
    for body, message in [
        ("not json", "the body is not JSON"),
        ('{"workers": "3"}', 'the body must be {"workers": N}'),
        ('{"workers": 3, "x": 1}', 'the body must be {"workers": N}'),
        ('{"workers": 0}', "workers must be >= 1, got 0"),
        ("[3]", "the body must be a JSON object"),
    ]:
        code, said = await _error(jp_fetch, "distrain", "jobs", job.id, method="PATCH", body=body)
        assert (code, said[: len(message)]) == (400, message)
    logs = ("distrain", "jobs", job.id, "logs")
    assert (await _error(jp_fetch, *logs, params={"tail": "x"}))[0] == 400
    assert (await _error(jp_fetch, *logs, params={"tail": 0}))[0] == 400
    assert (await _error(jp_fetch, *logs, params={"process": "nobody"}))[0] == 400
    assert (await _error(jp_fetch, *logs, params={"process": "worker-7"}))[0] == 404
    metrics = ("distrain", "jobs", job.id, "metrics")
    assert (await _error(jp_fetch, *metrics, params={"since": -1}))[0] == 400


async def _last_activity(fetch) -> datetime.datetime:
    status = _json(await fetch("api", "status"))  # itself not counted as activity
    return datetime.datetime.fromisoformat(status["last_activity"].replace("Z", "+00:00"))


async def test_a_running_job_is_activity_and_reading_the_routes_is_not(jp_fetch):
    finished = _finished_job()
    while finished.dir.supervisor_alive():  # it exits a moment after the job's end
        await asyncio.sleep(0.1)
    idle = await _last_activity(jp_fetch)
    for _ in range(3):  # what the sidebar polls
        await jp_fetch("distrain", "jobs")
        await jp_fetch("distrain", "jobs", finished.id, "logs")
        await asyncio.sleep(ACTIVITY_SECONDS)
    assert await _last_activity(jp_fetch) == idle
    job = _running_job()
    started = datetime.datetime.now(datetime.UTC)
    await asyncio.sleep(3 * ACTIVITY_SECONDS)
    assert await _last_activity(jp_fetch) > started  # the job, nothing else happened
    job.stop()


async def test_every_route_needs_authentication(jp_fetch):
    job = _finished_job()
    routes = [
        ("GET", ("distrain", "jobs")),
        ("DELETE", ("distrain", "jobs")),
        ("GET", ("distrain", "jobs", job.id)),
        ("PATCH", ("distrain", "jobs", job.id)),
        ("DELETE", ("distrain", "jobs", job.id)),
        ("GET", ("distrain", "jobs", job.id, "logs")),
        ("GET", ("distrain", "jobs", job.id, "metrics")),
        ("GET", ("distrain", "jobs", job.id, "stacks")),
        ("POST", ("distrain", "jobs", job.id, "stacks")),
        ("GET", ("distrain", "flags")),
        ("POST", ("distrain", "flags", "check")),
    ]
    for method, parts in routes:
        body = {"PATCH": json.dumps({"workers": 3}), "POST": json.dumps({"line": ""})}.get(method)
        code, _ = await _error(
            jp_fetch, *parts, method=method, body=body, headers={"Authorization": ""}
        )
        assert code == 403, (method, parts)
    assert job.state == "succeeded" and job.spec.workers == 2  # nothing was changed


async def test_the_flags_are_the_magics_and_a_line_is_checked_as_the_magic_does(
    jp_fetch, jobs_root
):
    """The form's fields come from the flag table (a launcher's options included), and
    its check is the magic's own, message for message; nothing is submitted."""
    served = _json(await jp_fetch("distrain", "flags"))
    assert served == flag_models()
    by_name = {flag["name"]: flag for flag in served["flags"]}
    assert by_name["workers"]["short"] == "n" and by_name["workers"]["default"] == "1"
    assert by_name["ssh-port"] == {
        **by_name["ssh-port"],
        "option": "ssh_port",
        "launchers": ["ssh"],
    }
    assert "slurm" in served["launchers"] and "auto" in served["backends"]

    async def check(line):
        answer = await jp_fetch(
            "distrain", "flags", "check", method="POST", body=json.dumps({"line": line})
        )
        return _json(answer)["error"]

    assert await check("--workers 2 --backend plain") is None
    assert await check("--workers 0") == "--workers must be a whole number >= 1, got 0"
    assert await check("--ssh-port 0 --launcher ssh --hosts h") == (
        "--ssh-port must be a port number 1-65535, got 0"
    )
    assert await check("--hosts h1") == "--hosts is for a multi-host launcher: add --launcher ssh"
    assert await check("--wrokers 2") == "unrecognized arguments: --wrokers 2"
    assert list(jobs_root.iterdir()) == []
    code, message = await _error(jp_fetch, "distrain", "flags", "check", method="POST", body="[1]")
    assert code == 400 and "line" in message


async def test_a_browser_session_needs_the_xsrf_token_to_change_a_job(
    jp_fetch, http_server_client, jp_base_url, jp_serverapp
):
    job = _running_job()
    # log in as a browser does: the token once, then the session cookie
    login = await http_server_client.fetch(
        f"{jp_base_url}tree?token={jp_serverapp.identity_provider.token}",
        follow_redirects=False,
        raise_error=False,
    )
    cookies = [c.split(";", 1)[0] for c in login.headers.get_list("Set-Cookie")]
    session = {"Cookie": "; ".join(cookies), "Authorization": ""}
    listed = await jp_fetch("distrain", "jobs", headers=session)  # reading needs no token
    assert job.id in {j["id"] for j in _json(listed)["jobs"]}
    for method in ("PATCH", "DELETE"):
        body = json.dumps({"workers": 3}) if method == "PATCH" else None
        code, _ = await _error(
            jp_fetch, "distrain", "jobs", job.id, method=method, body=body, headers=session
        )
        assert code == 403, method
    assert job.state == "running" and job.status().generation == 0
    # with the XSRF token the same session may stop it
    xsrf = next(c for c in cookies if c.startswith("_xsrf="))
    token = urllib.parse.unquote(xsrf.split("=", 1)[1])
    stopped = await jp_fetch(
        "distrain", "jobs", job.id, method="DELETE", headers={**session, "X-XSRFToken": token}
    )
    assert stopped.code == 202
    deadline = time.monotonic() + 30
    while job.state != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.2)


async def test_a_read_only_authorizer_may_forbid_changes_but_not_reads(jp_fetch):
    job = _running_job()
    RecordingAuthorizer.read_only = True
    listed = await jp_fetch("distrain", "jobs")
    assert job.id in {j["id"] for j in _json(listed)["jobs"]}
    await jp_fetch("distrain", "jobs", job.id, "logs")
    for method in ("PATCH", "DELETE"):
        body = json.dumps({"workers": 3}) if method == "PATCH" else None
        code, _ = await _error(jp_fetch, "distrain", "jobs", job.id, method=method, body=body)
        assert code == 403, method
    assert job.state == "running" and job.status().generation == 0
    assert ("GET", "read") in RecordingAuthorizer.asked
    assert {("PATCH", "write"), ("DELETE", "write")} <= set(RecordingAuthorizer.asked)
    RecordingAuthorizer.read_only = False
    assert (await jp_fetch("distrain", "jobs", job.id, method="DELETE")).code == 202
    assert job.wait(30) == "stopped"


async def test_a_scale_waiting_on_its_supervisor_does_not_hold_up_other_requests(jp_fetch):
    job = _running_job()
    supervisor = psutil.Process(job.dir.read_control().pid)
    supervisor.suspend()  # the control channel now answers nothing until it times out
    try:
        scale = asyncio.ensure_future(
            jp_fetch("distrain", "jobs", job.id, method="PATCH", body=json.dumps({"workers": 3}))
        )
        await asyncio.sleep(0.5)
        listed = await jp_fetch("distrain", "jobs")  # served while the scale waits
        assert job.id in {j["id"] for j in _json(listed)["jobs"]}
        assert not scale.done(), scale.exception() or scale.result().code
    finally:
        supervisor.resume()
    with contextlib.suppress(HTTPClientError):
        await scale
    job.stop()


async def test_finished_jobs_are_not_reparsed_on_every_poll(jp_fetch, monkeypatch):
    job = _finished_job()
    reads: list[str] = []
    read_state = JobDir.read_state

    def counted(self):
        reads.append(self.id)
        return read_state(self)

    monkeypatch.setattr(JobDir, "read_state", counted)
    first = _json(await jp_fetch("distrain", "jobs"))["jobs"]
    made = reads.count(job.id)
    second = _json(await jp_fetch("distrain", "jobs"))["jobs"]
    assert first == second and made > 0 and reads.count(job.id) == made
    job.dir.state_file.write_text(job.dir.state_file.read_text())  # a new file: read again
    await jp_fetch("distrain", "jobs")
    assert reads.count(job.id) == 2 * made


LONG_LINE = f"""import sys
sys.stdout.write("x" * {3 * MAX_READ_BYTES // 2} + "\\n")
print("after the long line", flush=True)
"""


async def test_a_log_line_longer_than_one_read_does_not_stop_the_follow(jp_fetch):
    job = api.submit(JobSpec(code=LONG_LINE, workers=1, backend="plain"))
    assert job.wait(60) == "succeeded"
    offset, lines = 0, []
    for _ in range(5):
        answer = _json(
            await jp_fetch(
                "distrain",
                "jobs",
                job.id,
                "logs",
                params={"process": "worker-0", "offset": offset},
            )
        )
        assert answer["offset"] > offset or "after the long line" in lines
        offset = answer["offset"]
        lines += answer["lines"]
    assert "after the long line" in lines
    assert sum(len(line) for line in lines if set(line) == {"x"}) == 3 * MAX_READ_BYTES // 2


def test_a_metrics_line_longer_than_one_read_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"{" + b"x" * (2 * MAX_READ_BYTES) + b"}\n" + b'{"step": 1}\n')
    offset, lines = 0, []
    for _ in range(4):
        got, offset = _lines_after(path, offset)
        lines += got
    assert lines[-1] == b'{"step": 1}' and offset == path.stat().st_size


async def test_delete_on_the_jobs_removes_finished_jobs_never_a_running_one(jp_fetch):
    finished = [_finished_job() for _ in range(2)]
    running = _running_job()
    removed = _json(await jp_fetch("distrain", "jobs", method="DELETE", params={"keep": 1}))
    assert removed["removed"] == [finished[0].id]
    listed = {j["id"] for j in _json(await jp_fetch("distrain", "jobs"))["jobs"]}
    assert listed == {finished[1].id, running.id}
    RecordingAuthorizer.read_only = True
    assert (await _error(jp_fetch, "distrain", "jobs", method="DELETE"))[0] == 403
    RecordingAuthorizer.read_only = False
    assert _json(await jp_fetch("distrain", "jobs", method="DELETE"))["removed"] == [finished[1].id]
    assert running.state == "running"
    running.stop()


def test_pip_install_enables_the_server_extension():
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "server", "extension", "list"],
        capture_output=True,
        text=True,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert re.search(
        r"jupyter_distrain enabled\s+- Validating jupyter_distrain\.\.\.\s+"
        r"jupyter_distrain \S+ OK",
        text,
    ), text
