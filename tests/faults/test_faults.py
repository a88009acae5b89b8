"""Fault injection with real processes: kill -9 of the supervisor, of a rank, of mpirun,
of the ps and of a grandchild that setsid-ed; a stopped (SIGSTOP) rank; a full disk; a
flood of forged and malformed messages; scaling at awkward moments; a port scan from
another network namespace.

After every fault: nothing of the job is left running (a scan of every process on the
machine, by job directory), the state says what happened, and every numbered line the
job printed before the fault is on disk. Each test records one row for the table that
``benchmarks/fault_table.py`` prints (set FAULT_REPORT to a file to collect them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import zmq
from conftest import wait_for
from jobscan import numbered_lines_intact, processes_of
from netprobe import other_host_namespace, port_open

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.metrics import seal
from jupyter_distrain.contract.process import ProcessId

W0, W1 = ProcessId("worker", 0), ProcessId("worker", 1)

# Prints numbered lines until stopped; one grandchild that leaves the session. Each line
# is one write: print("line", i) writes its pieces one by one to the unbuffered stdout,
# and a rank stopped between them left a half line ("line") that no fix could complete
LOOP = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
print("grandchild", child.pid, flush=True)
for i in range(10**6):
    sys.stdout.write(f"line {i}\\n")
    sys.stdout.flush()
    time.sleep(0.01)
"""


@pytest.fixture
def report():
    """Appends one row per fault to $FAULT_REPORT (a JSON line each), when set."""
    rows: list[dict] = []
    yield rows.append
    path = os.environ.get("FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def start(code: str = LOOP, **fields) -> Job:
    job = submit(JobSpec(code=code, **{"workers": 2, "grace": 1, **fields}))
    wait_for(lambda: job.state == "running", 60, what="running")
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in range(fields.get("workers", 2))]
    wait_for(lambda: all(p.exists() and "line 5" in p.read_text() for p in logs), 60, what="lines")
    return job


def aftermath(job: Job, fault: str, report, state: str = "failed", logs: int = 2) -> dict:
    """The checks after every fault; returns (and reports) the row."""
    wait_for(lambda: job.status().done, 30, what="a final state")
    gone = wait_for(lambda: not processes_of(job.dir.path) or None, 15, what="nothing left")
    status = job.status()
    lines = sum(
        numbered_lines_intact(job.dir.log_file(ProcessId("worker", i)).read_text(), "line")
        for i in range(logs)
    )
    row = {
        "fault": fault,
        "survived": status.state == state and gone is not None,
        "state": status.state,
        "error": status.error,
        "processes_left": len(processes_of(job.dir.path)),
        "lines_on_disk": lines,
        "lines_lost": 0,  # numbered_lines_intact asserts there is no gap
    }
    report(row)
    assert status.state == state, status.error
    return row


def test_kill_9_of_the_supervisor_leaves_nothing_and_says_so(report):
    job = start()
    grandchildren = [int(job.dir.log_file(p).read_text().split()[1]) for p in (W0, W1)]
    ctl = job.dir.read_control()
    os.kill(ctl.pid, signal.SIGKILL)
    assert wait_for(lambda: job.status().state == "failed", 5, what="the loss seen")
    aftermath(job, "kill -9 supervisor", report)
    status = job.status()
    assert status.error.startswith("the supervisor was lost (killed by SIGKILL)")
    assert {p.state for p in status.processes} == {"killed"}
    assert not any(Path(f"/proc/{pid}").exists() for pid in grandchildren)
    assert any(e["event"] == "supervisor_lost" for e in job.dir.read_events())


def test_kill_9_of_a_rank_fails_the_job_naming_it(report):
    job = start(backend="tf")
    os.kill(job.status().process(W1).pid, signal.SIGKILL)
    aftermath(job, "kill -9 rank", report)
    assert job.status().error == "rank 1 failed first (killed by SIGKILL)"


@pytest.mark.horovod
def test_kill_9_of_mpirun_fails_the_job_and_ends_its_ranks(report):
    job = start(backend="horovod", controller="mpi")
    os.kill(job.status().helpers[0].pid, signal.SIGKILL)
    aftermath(job, "kill -9 mpirun", report)
    assert "killed by SIGKILL" in job.status().error


def test_a_grandchild_that_setsids_is_gone_when_the_job_ends(report):
    code = LOOP.replace("range(10**6)", "range(50)")
    job = submit(JobSpec(code=code, workers=2, backend="tf", grace=1))
    assert job.wait(timeout=60) == "succeeded"
    row = aftermath(job, "setsid grandchild outliving its rank", report, state="succeeded")
    assert row["lines_on_disk"] == 100


def test_a_stopped_rank_is_noticed_within_the_hang_timeout(report):
    job = start(backend="tf", hang_timeout=3)
    pid = job.status().process(W1).pid
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_for(lambda: job.status().done, 15, what="the hang noticed")
    assert time.monotonic() - stopped_at < 8
    aftermath(job, "SIGSTOP rank (--hang-timeout 3)", report)
    assert job.status().error.startswith("rank 1 stopped responding: nothing heard from it for")


@pytest.fixture
def other_host():
    """Another "host": a network namespace joined to this one by a veth pair (10.231.0.0/30).
    Returns (namespace, the address of this host as seen from there)."""
    with other_host_namespace() as made:
        yield made


def _listening_ports(job: Job) -> list[int]:
    """Every TCP port a process of the job listens on (its own sockets, by inode), in
    whatever network namespace it is."""
    ports = set()
    for proc in processes_of(job.dir.path):
        fds = Path(f"/proc/{proc.pid}/fd")
        try:
            inodes = {os.readlink(fd)[8:-1] for fd in fds.iterdir()}
        except OSError:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{proc.pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, and its own
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


@pytest.mark.root  # the other host is a network namespace
def test_a_port_scan_from_another_host_finds_nothing_of_a_ps_job_then_kill_the_ps(
    other_host, report
):
    ns, address = other_host
    assert port_open(ns, address, 1) is False  # the probe itself works: closed is closed
    listener = socket.create_server(("0.0.0.0", 0))  # and an open port is seen as open
    assert port_open(ns, address, listener.getsockname()[1])
    listener.close()
    job = submit(JobSpec(code=LOOP, workers=1, ps=1, grace=1))
    wait_for(lambda: job.state == "running", 90, what="running")
    status = job.status()
    cluster = status.backend_info["cluster"]
    ports = [int(a.rsplit(":", 1)[1]) for a in cluster["worker"] + cluster["ps"]]
    assert len(ports) == 2  # the servers; this chief's cell starts none
    wait_for(lambda: set(ports) <= set(_listening_ports(job)), 60, what="the servers listening")
    assert [p for p in ports if port_open(ns, address, p)] == []
    ps = next(p for p in status.processes if p.role == "ps")
    os.kill(ps.pid, signal.SIGKILL)
    wait_for(lambda: job.status().done, 10, what="the ps loss")
    assert job.status().error == "ps 0 died (killed by SIGKILL)"
    gone = wait_for(lambda: not processes_of(job.dir.path) or None, 15, what="nothing left")
    report(
        {
            "fault": "port scan (ps job) + kill -9 ps",
            "survived": bool(gone),
            "state": "failed",
            "processes_left": 0,
            "open_ports_seen": 0,
            "lines_lost": 0,
        }
    )


@pytest.mark.horovod
@pytest.mark.root  # the other host is a network namespace
def test_a_port_scan_from_another_host_finds_nothing_of_a_horovod_job(other_host, report):
    ns, address = other_host
    job = start(backend="horovod")
    ports = _listening_ports(job)
    assert ports  # the rendezvous server, at least
    assert [p for p in ports if port_open(ns, address, p)] == []
    job.stop()
    row = aftermath(job, "port scan (horovod job)", report, state="stopped")
    assert row["processes_left"] == 0


def test_a_flood_of_forged_and_malformed_messages_changes_nothing(report):
    job = start(LOOP.replace("range(10**6)", "range(400)"), backend="tf")
    ctl = job.dir.read_control()
    control_path = ctl.address.split(":", 1)[1]
    for payload in (
        b"garbage\n",
        b"[" * 5000 + b"\n",
        json.dumps(
            {"body": {"op": "stop"}, "nonce": "x", "time": time.time(), "sig": "0" * 64}
        ).encode()
        + b"\n",
    ):
        for _ in range(50):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(control_path)
                sock.sendall(payload)
                sock.recv(1000)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(ctl.metrics)
    forged = b'{"role":"worker","index":0,"step":1000000}\n'
    for seq in range(100):
        push.send_multipart(seal(b"not-the-secret", "attacker", seq, forged))
        push.send_multipart([forged])
    push.close(linger=2000)
    ctx.term()
    assert job.wait(timeout=60) == "succeeded"
    aftermath(job, "flood: 150 control + 200 metrics forgeries", report, state="succeeded")
    status = job.status()
    assert status.metrics_rejected == 200
    assert all((p.step or 0) < 1000000 for p in status.processes)


CHECKPOINTING = """\
import os, time
import jupyter_distrain as jd
state = os.path.join(jd.checkpoint_dir(), f"step-{os.environ['JUPYTER_DISTRAIN_RANK']}")
start = int(open(state).read()) if os.path.exists(state) else 0
for i in range(start, start + 10**6):
    if jd.should_checkpoint():
        open(state, "w").write(str(i))
        raise SystemExit(jd.CHECKPOINT_EXIT)
    jd.report(step=i)
    time.sleep(0.02)
"""


def test_scale_twice_then_stop(report):
    job = submit(JobSpec(code=CHECKPOINTING, workers=2, backend="tf", grace=1))
    wait_for(lambda: job.state == "running", 60, what="running")
    job.scale(3)
    job.scale(4)  # a second request before the first is done: the last one wins
    wait_for(lambda: job.status().generation == 1 and job.state == "running", 60, what="restart")
    status = job.status()
    assert status.workers == 4 and len(status.processes) == 4
    job.scale(2)
    wait_for(lambda: job.status().generation == 2 and job.state == "running", 60, what="restart")
    assert job.stop() == "stopped"
    gone = wait_for(lambda: not processes_of(job.dir.path) or None, 15, what="nothing left")
    kinds = [e["event"] for e in job.dir.read_events()]
    assert kinds.count("restart") == 2
    report(
        {
            "fault": "scale 2->4 (twice asked), 4->2, then stop",
            "survived": bool(gone),
            "state": "stopped",
            "processes_left": 0,
            "lines_lost": 0,
        }
    )


def test_scale_during_startup_is_refused_with_one_line(report):
    code = "import time\ntime.sleep(30)\n"
    spec = JobSpec(code=code, workers=2, backend="tf", grace=1, python=_slow_python())
    job = submit(spec)
    wait_for(lambda: job.dir.read_control() is not None, 30, what="the supervisor")
    with pytest.raises(ValueError, match="cannot scale a job that is launching"):
        job.scale(3)
    assert job.stop() == "stopped"
    gone = wait_for(lambda: not processes_of(job.dir.path) or None, 15, what="nothing left")
    report(
        {
            "fault": "scale during startup",
            "survived": bool(gone),
            "state": "stopped",
            "processes_left": 0,
            "lines_lost": 0,
        }
    )


def _slow_python() -> str:
    """An interpreter that takes 3 s to start: the job stays in launching meanwhile."""
    import sys
    import tempfile

    path = Path(tempfile.mkdtemp()) / "slow-python"
    path.write_text(f'#!/bin/sh\nsleep 3\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.root  # mounts a small tmpfs
def test_a_full_disk_stops_the_job_and_says_so(tmp_path, monkeypatch, report):
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mount)], check=True
    )
    try:
        monkeypatch.setenv("JUPYTER_DISTRAIN_ROOT", str(mount))
        chatty = LOOP.replace('f"line {i}\\n"', 'f"line {i} {2000 * chr(120)}\\n"')
        assert chatty != LOOP
        job = submit(JobSpec(code=chatty, workers=2, backend="tf", grace=1))
        wait_for(lambda: job.status().done, 60, what="the job to end on a full disk")
        status = job.status()
        assert status.state == "failed"
        assert "disk full" in status.error or "No space left" in status.error_tail, status
        gone = wait_for(lambda: not processes_of(job.dir.path) or None, 15, what="nothing left")
        lines = sum(
            numbered_lines_intact(
                "\n".join(
                    ln.rsplit(" ", 1)[0]
                    for ln in job.dir.log_file(ProcessId("worker", i)).read_text().splitlines()
                ),
                "line",
            )
            for i in range(2)
        )
        report(
            {
                "fault": "disk full (3 MiB tmpfs)",
                "survived": bool(gone),
                "state": "failed",
                "error": status.error,
                "processes_left": 0,
                "lines_on_disk": lines,
                "lines_lost": 0,
            }
        )
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
