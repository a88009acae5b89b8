"""Jobs of ordinary accounts, on a machine that allows user namespaces and in a container
that refuses them (tests/users/no_namespaces.py): isolation is decided and checked before
any process starts, and a job that cannot be isolated runs and says what others reach.
Run as the test account (the user battery) or as root (then through runuser)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import running, wait_for
from useraccounts import ALICE, BOB, USERS, as_user, reachable_by, run_as

ALLREDUCE = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.item(), "world", dist.get_world_size(), "netns", os.stat("/proc/self/ns/net").st_ino)
"""


# what each rank prints: whom it runs as, and where
WHOAMI = "import getpass, socket\nprint('user', getpass.getuser(), 'on', socket.gethostname())\n"


def submit_as(
    user: str, no_namespaces: bool = False, env: dict[str, str] | None = None, **fields
) -> dict:
    """Submit the job ``fields`` describe as ``user`` (tests/users/submit.py, with ``env``
    added to that account's login environment); its outcome."""
    fields = {"code": ALLREDUCE, "workers": 2, "backend": "torch", "timeout": 60, **fields}
    given = ["env", *(f"{k}={v}" for k, v in (env or {}).items())]
    done = run_as(
        user,
        [*given, sys.executable, "-m", "submit", json.dumps(fields)],
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


def test_an_ordinary_user_runs_a_job_on_a_local_ray_of_her_own():
    # no Ray cluster runs: the job starts one for itself, as her, in her job's network
    code = "import getpass\nprint('user', getpass.getuser())\n"
    outcome = submit_as(ALICE, code=code, backend="plain", launcher="ray", cpu=0.5, timeout=120)
    assert outcome["state"] == "succeeded", outcome["error"]
    assert "Ray: no running cluster found; the job starts a local one" in outcome["notes"]
    lines = [line for log in outcome["logs"].values() for line in log.splitlines()]
    said = [line for line in lines if line.startswith("user")]
    assert said == [f"user {ALICE}"] * 2, outcome["logs"]
    assert outcome["warnings"] == []  # its Ray was in the job's own network namespace


ELASTIC = (
    "import horovod.tensorflow as hvd\nhvd.init()\n"
    "@hvd.elastic.run\ndef train(state):\n    pass\n"
    "train(hvd.elastic.ObjectState(step=0))\n"
)


# Each runs a server that runs what a caller sends it: Horovod elastic's rendezvous
# unpickles, TensorFlow's gRPC servers run any graph (its ops write files)
@pytest.mark.parametrize(
    "backend, code, said",
    [
        ("horovod", ELASTIC, "Horovod elastic's rendezvous server unpickles"),
        ("tf", "print(1)", "TensorFlow's gRPC servers run any graph"),
    ],
    ids=["horovod-elastic", "tf"],
)
def test_where_namespaces_are_refused_a_job_whose_server_runs_code_is_refused_in_one_line(
    backend, code, said
):
    outcome = submit_as(ALICE, no_namespaces=True, code=code, backend=backend)
    assert outcome["state"] == "failed"
    assert outcome["error"].startswith("not started: no private network namespace"), outcome
    assert said in outcome["error"] and "\n" not in outcome["error"] and outcome["logs"] == {}


TRAINING = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
while True:
    dist.barrier()
    time.sleep(0.2)
"""


# What a neighbour tries against a job: argv is the job's directory, its Unix sockets by
# name ({"control": path, ...}) and the ports its processes listen on; prints what it got
PROBE = """
import json, socket, sys
out = {}
try:
    open(sys.argv[1] + "/spec.json").read(); out["read"] = True
except OSError as e:
    out["read"] = type(e).__name__
for name, path in json.loads(sys.argv[2]).items():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path); out[name] = True
    except OSError as e:
        out[name] = type(e).__name__
for port in json.loads(sys.argv[3]):
    try:
        socket.create_connection(("127.0.0.1", port), 2).close(); out[port] = True
    except OSError as e:
        out[port] = type(e).__name__
print(json.dumps(out))
"""


# The neighbour's requests to the owner's Jupyter server: argv is its URL and a job id;
# prints each request's HTTP status (without the owner's token, then with a guessed one)
REST_PROBE = """
import json, sys, urllib.error, urllib.request
base, job = sys.argv[1], sys.argv[2]
out = {}
for token in ("", "guessed"):
    for method, path in (("GET", "jobs"), ("GET", "jobs/" + job), ("DELETE", "jobs/" + job),
                         ("PATCH", "jobs/" + job), ("GET", "jobs/" + job + "/logs")):
        headers = {"Authorization": "token " + token} if token else {}
        data = b'{"workers": 3}' if method == "PATCH" else None
        request = urllib.request.Request(base + path, data, headers, method=method)
        try:
            out[f"{method} {path} {token}"] = urllib.request.urlopen(request, timeout=10).status
        except urllib.error.HTTPError as e:
            out[f"{method} {path} {token}"] = e.code
print(json.dumps(out))
"""


@contextlib.contextmanager
def jupyter_server_of(user: str) -> Iterator[tuple[str, str]]:
    """A Jupyter server (with this package's extension) run by ``user`` on loopback:
    yields its ``distrain/`` URL and its token; stopped at the end."""
    with socket.socket() as probe:  # a free port: the server takes it just after
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    argv = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1"]
    argv += [f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
    server = subprocess.Popen(
        as_user(user, argv),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}/distrain/", token
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def rest_get(url: str, token: str) -> dict | None:
    """GET ``url`` with ``token``: its JSON; None while the server does not answer."""
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())
    except OSError:
        return None


@pytest.mark.root  # acts as both accounts
@pytest.mark.parametrize("no_namespaces", [False, True], ids=["namespaces", "no-namespaces"])
def test_a_neighbour_can_neither_see_nor_touch_a_running_job(no_namespaces):
    with jupyter_server_of(ALICE) as (url, token):
        _a_neighbour_can_neither_see_nor_touch_a_running_job(no_namespaces, url, token)


def _a_neighbour_can_neither_see_nor_touch_a_running_job(no_namespaces, url, token):
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
        sockets = {
            "control": control.address.removeprefix("unix:"),
            "metrics": control.metrics.removeprefix("ipc://"),
        }
        assert all(path.startswith("/") for path in sockets.values()), sockets
        probed = run_as(
            BOB, [sys.executable, "-c", PROBE, job["dir"], json.dumps(sockets), json.dumps(ports)]
        )
        seen = json.loads(probed.stdout)
        assert [seen.pop(k) for k in ("read", "control", "metrics")] == ["PermissionError"] * 3
        # her own server lists the job; his requests to it, without her token, are refused
        listed = wait_for(lambda: rest_get(url + "jobs", token), 60, what="her Jupyter server")
        assert job["id"] in [j["id"] for j in listed["jobs"]], listed
        asked = json.loads(run_as(BOB, [sys.executable, "-c", REST_PROBE, url, job["id"]]).stdout)
        assert set(asked.values()) == {403}, asked
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


# The neighbour's requests on a pool's socket: argv is its path and a file the claimed
# process would write; prints whether the socket took the connection, the claim and a drain
FROM_POOL = "from jupyter_distrain.pool import client, wire\n"
CLAIM = (
    FROM_POOL
    + """
import json, sys
wire.connect(sys.argv[1], 5).close()
code = "open(%r, 'w').write('ran')" % sys.argv[2]
request = {"argv": [sys.executable, "-c", code], "env": {}, "cwd": "/tmp", "log": "/tmp/x.log",
           "cpus": None, "job": "/tmp", "run": "x", "ahead": False}
claimed = not isinstance(client.claim(sys.argv[1], request), str)  # a str: why not
try:  # ask it to end its idle processes, as her own %distributed pool --clear does
    drained = client._ask(sys.argv[1], {"op": "drain"})
except OSError as e:
    drained = type(e).__name__
print(json.dumps({"connected": True, "claimed": claimed, "drained": drained}))
"""
)


def pool_line(user: str) -> str:
    """``user``'s ``%distributed pool`` listing."""
    return run_as(user, [sys.executable, "-m", "jupyter_distrain.cli", "pool"]).stdout


@pytest.mark.root  # acts as both accounts, and lets the neighbour reach the socket
def test_a_neighbour_cannot_claim_a_process_from_a_users_warm_pool(tmp_path):
    """Even given a way to her pool's socket (her directories are 0700: here root opens
    them to him with ACLs), his claim and his drain are refused: the keeper serves its own
    user only, and her pool goes on."""
    assert submit_as(ALICE, pool=True)["state"] == "succeeded"  # her pool fills after it
    wait_for(lambda: re.search(r"torch for .*; [1-9]\d* idle", pool_line(ALICE)), 120, what="pool")
    where = "print(*[wire.keeper_socket(client.pools_dir() / p.name) for p in client.list_pools()])"
    found = run_as(ALICE, [sys.executable, "-c", FROM_POOL + where]).stdout.split()
    (keeper,) = map(Path, found)
    hers = [p for p in keeper.parents if p.stat().st_uid == pwd.getpwnam(ALICE).pw_uid]
    assert hers and hers[-1].stat().st_mode & 0o077 == 0  # her folder, closed to others
    marker = tmp_path / "claimed"  # where a claimed process (as her) would write
    try:
        with reachable_by(BOB, keeper, "rw"), reachable_by(ALICE, tmp_path, "rwx"):
            said = run_as(BOB, [sys.executable, "-c", CLAIM, str(keeper), str(marker)])
            answers = json.loads(said.stdout)  # the keeper hangs up on him
            time.sleep(1)
            assert not marker.exists()
        assert answers.pop("drained") in (None, "ConnectionResetError", "BrokenPipeError")
        assert answers == {"connected": True, "claimed": False}, said.stderr
        assert re.search(r"torch for .*; [1-9]\d* idle, \d+ starting, 0 running", pool_line(ALICE))
    finally:
        run_as(ALICE, [sys.executable, "-m", "jupyter_distrain.cli", "pool", "--clear"])


HOROVOD_TRAINING = """
import time
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
print("ready", flush=True)
while True:
    hvd.allreduce(tf.constant(1.0))
    time.sleep(0.2)
"""

# The neighbour's PUT of a pickle to a Horovod rendezvous: argv is its port and a file the
# pickle writes when it is loaded; prints the HTTP status of each PUT
PICKLE_PROBE = """
import http.client, json, os, pickle, sys
class Marker:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
statuses = []
for path in ("/global/0", "/rank_and_size/x", "/runfunc/result"):
    connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
    try:
        connection.request("PUT", path, body=pickle.dumps(Marker()))
        statuses.append(connection.getresponse().status)
    except OSError as e:
        statuses.append(type(e).__name__)
print(json.dumps(statuses))
"""


@pytest.mark.horovod
@pytest.mark.root  # acts as both accounts
def test_without_namespaces_a_neighbours_pickle_to_the_horovod_rendezvous_runs_nothing(tmp_path):
    """Without namespaces the rendezvous of a (non-elastic) Horovod job is on loopback,
    where her neighbour reaches it, as the job's warning says: it stores what he PUTs
    as bytes and unpickles nothing (an elastic one, which would, is refused there)."""
    started = submit_as(
        ALICE, no_namespaces=True, code=HOROVOD_TRAINING, backend="horovod", detach=True
    )
    job_dir = Path(started["dir"])
    marker = tmp_path / "ran"  # written if a process of hers ran his pickle
    try:
        wait_for(
            lambda: (
                sum("ready" in p.read_text() for p in (job_dir / "logs").glob("worker-*.log")) == 2
            ),
            120,
            what="both ranks up",
        )
        warnings = json.loads((job_dir / "state.json").read_text())["warnings"]
        said = re.search(
            r"Horovod rendezvous \(unauthenticated, 127\.0\.0\.1\) on port (\d+)", warnings[0]
        )
        assert said, warnings
        with reachable_by(ALICE, tmp_path, "rwx"):
            probed = run_as(BOB, [sys.executable, "-c", PICKLE_PROBE, said[1], str(marker)])
            statuses = json.loads(probed.stdout)
            time.sleep(2)
            assert not marker.exists()
        assert 200 in statuses, statuses  # he reached it (as the warning said it would)
    finally:
        stopped = run_as(
            ALICE, [sys.executable, "-m", "jupyter_distrain.cli", "stop", started["id"]]
        )
    assert stopped.returncode == 0, stopped.stderr
