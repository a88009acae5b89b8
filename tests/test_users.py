"""Jobs of ordinary accounts, on a machine that allows user namespaces and in a container
that refuses them (tests/users/no_namespaces.py): isolation is decided and checked before
any process starts, and a job that cannot be isolated runs and says what others reach.
Run as the test account (the user battery) or as root (then through runuser)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import running, wait_for
from useraccounts import ALICE, BOB, USERS, run_as

ALLREDUCE = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.item(), "world", dist.get_world_size(), "netns", os.stat("/proc/self/ns/net").st_ino)
"""


def submit_as(user: str, no_namespaces: bool = False, **fields) -> dict:
    fields = {"code": ALLREDUCE, "workers": 2, "backend": "torch", "timeout": 60, **fields}
    done = run_as(
        user,
        [sys.executable, "-m", "submit", json.dumps(fields)],
        no_namespaces=no_namespaces,
        cwd=str(USERS),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sums(outcome: dict) -> list[tuple[str, str]]:
    lines = [line.split() for log in outcome["logs"].values() for line in log.splitlines()]
    return [(w[1], w[3]) for w in lines if w[:1] == ["sum"]]


def test_an_ordinary_users_job_runs_in_a_private_network_with_loopback_up():
    # the ids were read after unshare(CLONE_NEWUSER): uid_map failed, loopback stayed
    # down, and rank 0's TCPStore client retried "Network is unreachable" for 30 minutes
    outcome = submit_as(ALICE)
    assert outcome["state"] == "succeeded", outcome["error"]
    assert outcome["warnings"] == []
    assert _sums(outcome) == [("3.0", "2")] * 2
    netns = {
        line.split()[-1]
        for log in outcome["logs"].values()
        for line in log.splitlines()
        if line.startswith("sum")
    }
    assert len(netns) == 1 and netns != {str(outcome["netns"])}  # one namespace, not the host's


def test_where_namespaces_are_refused_the_job_runs_and_says_who_reaches_which_port():
    outcome = submit_as(ALICE, no_namespaces=True)
    assert outcome["state"] == "succeeded", outcome["error"]
    assert _sums(outcome) == [("3.0", "2")] * 2
    (warning,) = outcome["warnings"]
    assert warning.startswith(
        "no private network namespace (Operation not permitted): reachable by other users "
        "of this machine (and other hosts, for a server on every interface): torch TCPStore"
    ), warning


def test_where_namespaces_are_refused_a_horovod_elastic_job_is_refused_with_one_line():
    elastic = (
        "import horovod.tensorflow as hvd\nhvd.init()\n"
        "@hvd.elastic.run\ndef train(state):\n    pass\n"
        "train(hvd.elastic.ObjectState(step=0))\n"
    )
    outcome = submit_as(ALICE, no_namespaces=True, code=elastic, backend="horovod")
    assert outcome["state"] == "failed"
    assert outcome["error"].startswith("not started: no private network namespace"), outcome[
        "error"
    ]
    assert "\n" not in outcome["error"] and outcome["logs"] == {}


TRAINING = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
while True:
    dist.barrier()
    time.sleep(0.2)
"""


@pytest.mark.root  # acts as both accounts
@pytest.mark.parametrize("no_namespaces", [False, True], ids=["namespaces", "no-namespaces"])
def test_a_neighbour_can_neither_see_nor_touch_a_running_job(no_namespaces):
    from netprobe import listening_sockets

    from jupyter_distrain.contract.control import ControlInfo

    started = run_as(
        ALICE,
        [
            sys.executable,
            "-m",
            "submit",
            json.dumps({"code": TRAINING, "workers": 2, "backend": "torch", "detach": True}),
        ],
        no_namespaces=no_namespaces,
        cwd=str(USERS),
    )
    assert started.returncode == 0, started.stderr[-3000:]
    job = json.loads(started.stdout.strip().splitlines()[-1])
    job_dir = Path(job["dir"])
    try:
        wait_for(
            lambda: (
                all("ready" in p.read_text() for p in (job_dir / "logs").glob("worker-*.log"))
                and len(list((job_dir / "logs").glob("worker-*.log"))) == 2
            ),
            60,
            what="both ranks up",
        )
        control = ControlInfo(**json.loads((job_dir / "control").read_text()))
        pids = json.loads((job_dir / "state.json").read_text())["processes"]
        ports = sorted({port for p in pids for _, port in listening_sockets(p["pid"])})
        assert ports  # the TCPStore, Gloo's pairs
        cli = [sys.executable, "-m", "jupyter_distrain.cli"]
        assert run_as(BOB, [*cli, "list"]).stdout.strip() == "no jobs"
        for command in (
            ["status", job["id"]],
            ["stop", job["id"]],
            ["scale", job["id"], "3"],
            ["logs", job["id"]],
        ):
            said = run_as(BOB, [*cli, *command])
            assert said.returncode != 0 and "no job" in said.stdout + said.stderr, said
        probe = (
            "import json, socket, sys\n"
            "out = {}\n"
            "try:\n    open(sys.argv[1] + '/spec.json').read(); out['read'] = True\n"
            "except OSError as e:\n    out['read'] = type(e).__name__\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[2]); out['control'] = True\n"
            "except OSError as e:\n    out['control'] = type(e).__name__\n"
            "for port in json.loads(sys.argv[3]):\n"
            "    try:\n        socket.create_connection(('127.0.0.1', port), 2).close(); out[port] = True\n"
            "    except OSError as e:\n        out[port] = type(e).__name__\n"
            "print(json.dumps(out))\n"
        )
        probed = run_as(
            BOB,
            [
                sys.executable,
                "-c",
                probe,
                job["dir"],
                control.address.removeprefix("unix:"),
                json.dumps(ports),
            ],
        )
        seen = json.loads(probed.stdout)
        assert seen.pop("read") == "PermissionError" and seen.pop("control") == "PermissionError"
        reached = [port for port, how in seen.items() if how is True]
        if no_namespaces:  # said, port by port, in the job's warning
            assert reached, seen
        else:
            assert reached == [], seen
        assert json.loads((job_dir / "state.json").read_text())["state"] == "running"
    finally:
        stopped = run_as(ALICE, [sys.executable, "-m", "jupyter_distrain.cli", "stop", job["id"]])
    assert stopped.returncode == 0, stopped.stderr
    assert not any(running(p["pid"]) for p in pids)
