"""Jobs of ordinary accounts, on a machine that allows user namespaces and in a container
that refuses them (tests/users/no_namespaces.py): isolation is decided and checked before
any process starts, and a job that cannot be isolated runs and says what others reach.
Run as the test account (the user battery) or as root (then through runuser)."""

from __future__ import annotations

import json
import sys

from useraccounts import ALICE, USERS, run_as

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
        user, [sys.executable, "-m", "submit", json.dumps(fields)],
        no_namespaces=no_namespaces, cwd=str(USERS),
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
    netns = {line.split()[-1] for log in outcome["logs"].values() for line in log.splitlines() if line.startswith("sum")}
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
    assert outcome["error"].startswith("not started: no private network namespace"), outcome["error"]
    assert "\n" not in outcome["error"] and outcome["logs"] == {}
