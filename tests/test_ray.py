"""The Ray launcher on a real two-node Ray cluster (a head here and a node in a network
namespace, one CPU each, tests/raycluster.py): Horovod and parameter-server jobs across
both nodes, requests the cluster cannot place refused naming what it lacks with
nothing left behind, a Ray address that does not answer refused at submit, a local Ray
when there is none, a job outliving its kernel, a scale and a memory limit through the
actors, and a stopped job, or a lost supervisor, leaving no process, actor, placement
group or directory anywhere."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    STACKS_PROGRAM,
    check_stacks_of_the_odd_rank,
    fault_row,
    restart_after_killing_rank_1,
    wait_for,
)
from jobscan import left_after
from jobscan import processes_naming as job_processes
from netprobe import (
    interfaces_of,
    listening_sockets,
    network_namespace,
    other_host_namespace,
    port_open,
)
from raycluster import HEAD_ADDRESS, QUIET_RAY, RayCluster, ray_cluster
from test_session import check_a_session_across
from test_tf_backends import SEED_PROGRAM
from test_torch import DDP_PROGRAM, ddp_rerun_from_the_pool
from test_torch import SAID as DDP_SAID

from jupyter_distrain.client import api
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import JobSpec, SpecError
from jupyter_distrain.contract.store import list_job_dirs

pytestmark = pytest.mark.root  # the hosts are network namespaces

NODE_ADDRESSES = {HEAD_ADDRESS, "10.233.0.11"}

HOROVOD_PROGRAM = """\
import os
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
address = os.environ["JUPYTER_DISTRAIN_ADDRESS"]
print(f"rank {hvd.rank()} size {hvd.size()} sum {float(total)} at {address}", flush=True)
result = (hvd.rank(), hvd.size(), address)
"""

ENDLESS = """\
import time
step = 0
while True:
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ray_cluster(tmp_path_factory.mktemp("ray")) as made:
        yield made


@pytest.fixture(scope="module")
def driver(cluster):
    """This test process as a driver of the cluster, to look at its actors and groups."""
    import ray

    for key, value in QUIET_RAY.items():
        os.environ.setdefault(key, value)
    ray.init(address=cluster.gcs_address, log_to_driver=False, namespace="tests")
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def stop_jobs(jobs_root):
    """Whatever a test leaves running (it failed half-way) is stopped after it."""
    yield
    for job_dir in list_job_dirs(jobs_root):
        job = Job(job_dir)
        if not job.done:
            job.stop()


def wait_until_gone(job_id: str, seconds: float) -> list[psutil.Process]:
    return left_after(lambda: job_processes(job_id), seconds)


def leftovers(ray, job_id: str) -> list[str]:
    """The job's placement groups and actors the cluster's GCS still has (not removed,
    not dead). Ray's state API needs the full dashboard (``ray[default]``): the GCS's
    own tables are read instead."""
    from ray._private.state import actors as actor_table

    groups = [
        f"placement group {g['name']} {g['state']}"
        for g in ray.util.placement_group_table().values()
        if g["name"] == f"jupyter_distrain-{job_id}" and g["state"] != "REMOVED"
    ]
    actors = [
        f"actor {a['ActorID']} {a['State']}"
        for a in actor_table().values()
        if a["ActorClassName"] == "SlotAgent" and a["State"] != "DEAD"
    ]
    return groups + actors


def node_dirs(cluster: RayCluster, job_id: str) -> list[Path]:
    return [d for n in cluster.all_nodes for d in n.home.glob(f".jupyter_distrain/ray/{job_id}")]


def only_job(root: Path) -> Job:
    (job_dir,) = list_job_dirs(root)
    return Job(job_dir)


SHORT = """\
import time
for step in range(12):
    print(f"step {step}", flush=True)
    time.sleep(0.25)
"""


def listening(processes: list[psutil.Process]) -> dict[str, list[tuple[str, int]]]:
    """The TCP addresses each process listens on (read in its own network namespace)."""
    found: dict[str, list[tuple[str, int]]] = {}
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            sockets = listening_sockets(proc.pid)
            if sockets:
                found[f"{proc.name()} {proc.pid}"] = sockets
    return found


def test_without_an_address_or_a_running_ray_the_job_starts_a_local_one(
    jobs_root, tmp_path, monkeypatch
):
    """Runs before the cluster exists. The local Ray the supervisor starts is reachable
    from this machine only (from another network namespace no port of it answers, and
    every process of it listens on loopback), and goes with the job, its session
    directory too."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n")
    monkeypatch.setenv("HOME", str(home))
    for key, value in QUIET_RAY.items():
        monkeypatch.setenv(key, value)
    job = api.submit(JobSpec(code=ENDLESS, workers=2, backend="plain", launcher="ray", cpu=0.5))
    assert "Ray: no running cluster found; the job starts a local one" in job.notes
    wait_for(lambda: "step 3" in _log(job, 1), 240, what="steps")  # Ray may start twice
    assert job.dir.read_control().address.startswith("unix:")
    supervisor = psutil.Process(job.status().supervisor_pid)
    started = supervisor.children(recursive=True)  # the local Ray, the actors, the workers
    assert {"gcs_server", "raylet"} <= {p.name() for p in started}
    sockets = listening([supervisor, *started])
    assert sockets, "the local Ray listens on no TCP port"
    # Ray binds "::" whatever it is told: what keeps it off the network is that every
    # process of it is in the job's own namespace, where only loopback exists
    assert {network_namespace(p.pid) for p in started} == {network_namespace(supervisor.pid)}
    assert network_namespace(supervisor.pid) != network_namespace(os.getpid())
    assert interfaces_of(supervisor.pid) == ["lo"]
    sessions = {
        Path(arg.split("=", 1)[1]).parent.parent  # the job's private directory
        for p in started
        if p.name() == "raylet"
        for arg in p.cmdline()
        if arg.startswith("--session_dir=")
    }
    assert len(sessions) == 1 and all(d.is_dir() for d in sessions), sessions
    with other_host_namespace() as (ns, address):
        ports = sorted({port for found in sockets.values() for _, port in found})
        reachable = [p for p in ports if port_open(ns, address, p)]
    assert job.stop() == "stopped"
    gone, left = psutil.wait_procs(started, timeout=15)
    fault_row("port scan (a job's own local Ray)", not reachable, job.state, len(left))
    assert reachable == []
    assert left == [], [p.name() for p in left]
    assert wait_until_gone(job.id, 10) == []
    assert [d for d in sessions if d.exists()] == []


@pytest.mark.horovod
def test_a_horovod_job_runs_one_rank_on_each_node(cluster, driver, jobs_root):
    job = api.submit(
        JobSpec(
            code=HOROVOD_PROGRAM, workers=2, backend="horovod", out="answer", **cluster.options()
        )
    )
    assert job.wait(120) == "succeeded", job.status().error
    logs = {i: job.logs(ProcessId("worker", i)) for i in (0, 1)}
    said = {i: re.search(r"rank (\d) size (\d) sum ([\d.]+) at ([\d.]+)", logs[i]) for i in (0, 1)}
    assert all(said.values()), logs
    assert {m.group(2) for m in said.values()} == {"2"}  # hvd.size() == 2
    assert {m.group(3) for m in said.values()} == {"3.0"}
    assert {m.group(4) for m in said.values()} == NODE_ADDRESSES
    status = job.status()
    assert {p.address for p in status.processes} == NODE_ADDRESSES
    assert all(p.pid > 0 for p in status.processes)
    assert job.result() == (0, 2, said[0].group(4))  # result.pkl came back from its node
    # the metrics channel (TCP, signed) carried both ranks' records to the supervisor here
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    assert {r["index"] for r in records} == {0, 1}
    # the channels listen on TCP on this machine's address towards the nodes, only there
    control = job.dir.read_control()
    assert control.address.startswith(f"tcp:{HEAD_ADDRESS}:")
    assert control.metrics.startswith(f"tcp://{HEAD_ADDRESS}:")
    assert leftovers(driver, job.id) == []
    assert wait_until_gone(job.id, 10) == []
    assert node_dirs(cluster, job.id) == []


def test_a_torch_ddp_job_runs_one_rank_on_each_node(cluster, driver, jobs_root):
    """One CPU a slot, one a node: a rank on each, MASTER_ADDR rank 0's node address."""
    job = api.submit(JobSpec(code=DDP_PROGRAM, workers=2, backend="torch", **cluster.options()))
    assert job.wait(240) == "succeeded", job.status().error
    said = [DDP_SAID.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert {m.group(4) for m in said} == {said_address(job, 0)}  # rank 0's node address
    assert said[0].group(5) == said[1].group(5)  # identical weights
    assert {p.address for p in job.status().processes} == NODE_ADDRESSES
    assert leftovers(driver, job.id) == []
    assert node_dirs(cluster, job.id) == []


def said_address(job: Job, index: int) -> str:
    return next(p.address for p in job.status().processes if p.index == index)


def test_a_torch_session_on_two_nodes_keeps_its_state_and_survives_an_interrupt(
    cluster, driver, kernel, jobs_root
):
    job = check_a_session_across(
        kernel, cluster.flags(), jobs_root, lambda job_id: node_dirs(cluster, job_id)
    )
    wait_for(lambda: leftovers(driver, job.id) == [], 15, what="the session's actors to go")
    assert node_dirs(cluster, job.id) == []


def test_a_parameter_server_job_runs_across_the_nodes(cluster, driver, jobs_root):
    job = api.submit(
        JobSpec(
            code="SYNC = False\n" + SEED_PROGRAM,
            workers=2,
            ps=1,
            backend="ps",
            cpu=0.5,
            **cluster.options(),
        )
    )
    assert job.wait(180) == "succeeded", job.status().error
    match = re.search(r"final global_step (\d+) accuracy", job.logs(ProcessId("worker", 0)))
    assert match and int(match.group(1)) >= 40
    assert {p.address for p in job.status().processes} == NODE_ADDRESSES
    assert leftovers(driver, job.id) == []


def test_a_request_no_node_can_hold_is_refused_at_submit(cluster, jobs_root):
    started = time.monotonic()
    with pytest.raises(SpecError) as refused:
        api.submit(
            JobSpec(
                code="print(1)", workers=2, backend="plain", cpu=2, timeout=30, **cluster.options()
            )
        )
    assert time.monotonic() - started < 30
    assert "no node has 2 CPU (the largest has 1 CPU)" in str(refused.value)
    with pytest.raises(SpecError) as refused:
        api.submit(
            JobSpec(code="print(1)", workers=3, backend="plain", timeout=30, **cluster.options())
        )
    assert "3 slots need 3 CPU, the nodes have 1 CPU + 1 CPU" in str(refused.value)
    assert list_job_dirs(jobs_root) == []  # nothing launched


def test_a_request_the_busy_cluster_cannot_place_fails_within_the_timeout(
    cluster, driver, jobs_root
):
    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"CPU": 1}], strategy="PACK", name="held-by-the-test")
    driver.get(held.ready(), timeout=30)
    try:
        started = time.monotonic()
        job = api.submit(
            # 12 s: the pre-flight, cut off at --timeout too, imports Ray and connects (it
            # took over 5 s on these 2 loaded cores)
            JobSpec(code="print(1)", workers=2, backend="plain", timeout=12, **cluster.options())
        )
        with pytest.raises(Exception, match="failed"):
            job.wait(60)
        assert time.monotonic() - started < 40
        error = job.status().error
        assert "could not place 2 slots of 1 CPU within 12 s" in error, error
        assert "they need 2 CPU; free now: 1 CPU" in error, error
        assert leftovers(driver, job.id) == []
    finally:
        remove_placement_group(held)


def _refused_address(address: str, timeout: float) -> str:
    started = time.monotonic()
    with pytest.raises(SpecError) as refused:
        api.submit(
            JobSpec(
                code="print(1)",
                backend="plain",
                timeout=timeout,
                launcher="ray",
                ray_address=address,
            )
        )
    assert time.monotonic() - started < timeout + 2
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_ray_address_that_does_not_answer_is_refused_at_submit(cluster, jobs_root):
    message = _refused_address(f"{HEAD_ADDRESS}:1", 10)
    assert message == f"--address: no Ray cluster answers at {HEAD_ADDRESS}:1 (Connection refused)"
    message = _refused_address("10.233.0.99:6379", 10)  # no such host on the bridge
    assert message.startswith("--address: no Ray cluster answers at 10.233.0.99:6379 ("), message
    with socket.create_server((HEAD_ADDRESS, 0)) as silent:  # accepts, never speaks
        address = f"{HEAD_ADDRESS}:{silent.getsockname()[1]}"
        message = _refused_address(address, 5)
    assert (
        message == f"--address: the Ray cluster at {address} did not answer within 5 s (--timeout)"
    )
    assert list_job_dirs(jobs_root) == []
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if "ray_probe" in str(p.info["cmdline"])
    ]


def handed_job(**options: object) -> Job:
    """A job that prints a pushed value and an --env value, then steps on and on."""
    code = 'import os\nprint("pushed", pushed, os.environ["JD_TOKEN"], flush=True)\n' + ENDLESS
    spec = JobSpec(
        code=code,
        workers=2,
        backend="plain",
        push=["pushed"],
        env={"JD_TOKEN": "env-value-1234"},
        **options,
    )
    return api.submit(spec, namespace={"pushed": "pushed-value-5678"})


def assert_nothing_handed_is_in(directories: list[Path], job: Job) -> None:
    """The job's files are in ``directories`` (its logs aside), and no file there holds
    its secret, the pushed value or the --env value of :func:`handed_job`."""
    on_nodes = {
        path: path.read_bytes()
        for directory in directories
        for path in directory.rglob("*")
        if path.is_file() and "logs" not in path.parts
    }
    assert {p.name for p in on_nodes} >= {"spec.json", "train.py"}
    assert {p.name for p in on_nodes} & {"control", "push.pkl"} == set()
    for secret in (job.dir.read_control().secret, "pushed-value-5678", "env-value-1234"):
        assert [p for p, data in on_nodes.items() if secret.encode() in data] == []


def test_stop_leaves_nothing_on_either_node(cluster, driver, jobs_root):
    """Also: what another job of the cluster (the same OS user) could read in a slot's
    directory holds neither the job's secret nor the pushed values nor the --env values:
    they are handed to each process in memory, and the job works with them."""
    job = handed_job(**cluster.options())
    deadline = time.monotonic() + 60
    while not all(
        job.dir.log_file(ProcessId("worker", i)).exists()
        and "step 3" in job.logs(ProcessId("worker", i))
        for i in (0, 1)
    ):
        assert time.monotonic() < deadline and not job.done, job.status().error
        time.sleep(0.2)
    workers = [
        p for p in job_processes(job.id) if "jupyter_distrain.worker" in " ".join(p.cmdline())
    ]
    assert len(workers) == 2
    assert {p.address for p in job.status().processes} == NODE_ADDRESSES
    assert len(leftovers(driver, job.id)) == 3  # the group and both actors, seen while alive
    assert "pushed pushed-value-5678 env-value-1234" in job.logs(ProcessId("worker", 1))
    slots = node_dirs(cluster, job.id)
    assert len(slots) == 2
    assert_nothing_handed_is_in(slots, job)
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 15) == []
    assert leftovers(driver, job.id) == []
    assert node_dirs(cluster, job.id) == []


def test_the_stacks_of_ranks_on_two_nodes_show_where_each_stands(cluster, driver, jobs_root):
    job = api.submit(JobSpec(code=STACKS_PROGRAM, workers=2, backend="plain", **cluster.options()))
    report = check_stacks_of_the_odd_rank(job, 2)
    assert {p.host for p in report.processes} == {p.host for p in job.status().processes}
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 15) == []


def test_a_rank_killed_on_a_node_restarts_the_job_in_a_new_placement(cluster, driver, jobs_root):
    spec = JobSpec(
        code=ENDLESS, workers=2, backend="torch", max_restarts=1, grace=1, **cluster.options()
    )
    job = api.submit(spec)
    said = restart_after_killing_rank_1(job, "step 3")
    assert said.startswith("restart 1 of 1 after rank 1"), said
    log1 = job.dir.log_file(ProcessId("worker", 1))
    wait_for(lambda: log1.read_text().count("step 3\n") == 2, 60, what="rank 1 stepping again")
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 15) == []
    assert leftovers(driver, job.id) == []


def test_a_running_ray_is_found_without_an_address(cluster, jobs_root, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.gcs_address)
    job = api.submit(JobSpec(code=SHORT, workers=2, backend="plain", launcher="ray"))
    assert any(n.startswith(f"Ray cluster at {cluster.gcs_address}: nodes ") for n in job.notes)
    assert job.wait(60) == "succeeded", job.status().error
    assert {p.address for p in job.status().processes} == NODE_ADDRESSES


def test_a_job_goes_on_when_its_kernel_dies(cluster, kernel, jobs_root):
    out = kernel.execute(f"%%distributed --workers 2 {cluster.flags()} --background\n" + SHORT)
    assert out.error is None, out.error_text
    job = only_job(jobs_root)
    os.kill(kernel.pid, signal.SIGKILL)
    assert job.wait(60) == "succeeded", job.status().error
    for index in (0, 1):  # every line, in the log here
        lines = job.logs(ProcessId("worker", index)).splitlines()
        assert [line for line in lines if line.startswith("step")] == [
            f"step {i}" for i in range(12)
        ]


def test_a_lost_supervisor_leaves_nothing_running(cluster, driver, jobs_root):
    job = api.submit(JobSpec(code=ENDLESS, workers=2, backend="plain", **cluster.options()))
    wait_for(lambda: "step 3" in _log(job, 1), 60, what="steps")
    assert (
        len(
            [p for p in job_processes(job.id) if "jupyter_distrain.worker" in " ".join(p.cmdline())]
        )
        == 2
    )
    os.kill(job.status().supervisor_pid, signal.SIGKILL)
    assert wait_until_gone(job.id, 30) == []
    assert "the supervisor was lost" in job.status().error
    deadline = time.monotonic() + 30
    while leftovers(driver, job.id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers(driver, job.id) == []


def _log(job: Job, index: int) -> str:
    path = job.dir.log_file(ProcessId("worker", index))
    return path.read_text() if path.exists() else ""


COUNTING = """\
import os, sys, time
from jupyter_distrain.contract.process import CHECKPOINT_EXIT
from jupyter_distrain import checkpoint_dir, should_checkpoint
saved = checkpoint_dir() / "step"
start = int(saved.read_text()) if saved.exists() else 0
rank = os.environ["JUPYTER_DISTRAIN_RANK"]
print(f"rank {rank} starts at {start}", flush=True)
for step in range(start, 40):
    if should_checkpoint():
        if rank == "0":
            saved.write_text(str(step))
        sys.exit(CHECKPOINT_EXIT)
    print(f"step {step}", flush=True)
    time.sleep(0.25)
"""


def test_a_scale_checkpoints_through_the_actors_and_resumes_on_both_nodes(cluster, driver):
    job = api.submit(JobSpec(code=COUNTING, workers=1, backend="plain", **cluster.options()))
    wait_for(lambda: "step 4" in _log(job, 0), 60, what="steps")
    (first,) = job.status().processes
    job.scale(2)  # SIGUSR1 goes through the actor; the checkpoint comes back, then out again
    assert job.wait(120) == "succeeded", job.status().error
    resumed = re.findall(r"rank (\d) starts at (\d+)", _log(job, 0) + _log(job, 1))
    assert resumed[0] == ("0", "0") and len(resumed) == 3, resumed
    assert {rank for rank, _ in resumed[1:]} == {"0", "1"}
    assert len({at for _, at in resumed[1:]}) == 1 and int(resumed[1][1]) >= 5
    assert {p.address for p in job.status().processes} == NODE_ADDRESSES
    assert first.pid and first.address in NODE_ADDRESSES
    assert leftovers(driver, job.id) == []


def test_a_worker_over_its_memory_is_killed_naming_it(cluster):
    hog = (
        "import os, time\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    hog = bytearray(800 * 2**20)\n"
        "    hog[::4096] = b'x' * len(hog[::4096])\n"
        "time.sleep(60)\n"
    )
    job = api.submit(JobSpec(code=hog, workers=2, memory=0.5, backend="plain", **cluster.options()))
    with pytest.raises(Exception, match="worker 1 exceeded 0.5 GiB"):
        job.wait(60)  # the memory reading came from the actor on its node
    assert wait_until_gone(job.id, 15) == []


def test_a_rerun_takes_warm_processes_from_each_nodes_own_pool(
    cluster, driver, jobs_root, monkeypatch, capsys
):
    """Each node's pool (under the node's home, named by its host name) is started by
    the first job there and filled beside it: the re-run takes its ranks
    warm on both nodes, handed their secret in memory as cold ones are, and they still
    synchronise. ``%distributed pool`` lists each node's pool with its memory, and
    ``--clear`` drains them: nothing of it is left."""
    from jupyter_distrain.client.commands import print_pools
    from jupyter_distrain.pool import client as pool_client

    spec = JobSpec(code=DDP_PROGRAM, workers=2, backend="torch", **cluster.options())

    def pools() -> list[Path]:
        homes = [node.home for node in cluster.all_nodes]
        return [d for home in homes for d in home.glob(".jupyter_distrain/jobs/.pools/host-*")]

    try:

        def ready() -> bool:
            found = [pool_client.list_pools(base=d) for d in pools()]
            return len(found) == 2 and all(any(i.idle for i in infos) for infos in found)

        second = ddp_rerun_from_the_pool(spec, monkeypatch, ready)
        assert len({d.name for d in pools()}) == 2  # one pool per node
        capsys.readouterr()
        print_pools(clear=False)
        listed = capsys.readouterr().out
        for node in cluster.all_nodes:
            line = re.search(rf"^on {re.escape(node.address)} \(Ray\): torch-.*$", listed, re.M)
            assert line, listed
            assert re.search(r"keeper pid \d+; [12] idle.* \d+ MiB idle", line.group(0)), listed
        print_pools(clear=True)
        cleared = capsys.readouterr().out
        for node in cluster.all_nodes:
            assert f"on {node.address} (Ray): asked 1 pool(s)" in cleared, cleared
    finally:
        for directory in pools():
            pool_client.drain(base=directory)
    assert wait_for(
        lambda: not any(pool_client.list_pools(base=d) for d in pools()), 20, what="keepers"
    )
    assert leftovers(driver, second.id) == []


def test_a_rerun_on_the_same_cluster_is_not_probed_again(cluster, driver, jobs_root):
    """The pre-flight's probe (a Ray driver of its own, ~2 s) is remembered for a
    cluster that still answers: the re-run's submit starts no driver but the
    supervisor's (each driver is a job in the GCS's job table); an address where the
    cluster no longer answers is refused as before."""
    from ray._private.state import jobs as driver_table

    spec = JobSpec(code=SHORT, workers=2, backend="plain", **cluster.options())
    assert api.submit(spec).wait(60) == "succeeded"
    before = len(driver_table())
    second = api.submit(spec)
    assert second.wait(60) == "succeeded", second.status().error
    assert len(driver_table()) == before + 1  # the supervisor's only
    assert any(n.startswith(f"Ray cluster at {cluster.gcs_address}: ") for n in second.notes)


def test_a_rerun_is_supervised_by_a_standby_that_imported_ray(
    cluster, driver, jobs_root, monkeypatch
):
    """With pools on, a followed Ray job leaves the kernel a supervisor on standby with
    Ray imported (its ``_raylet`` mapped); the re-run is handed to it and runs."""
    from jupyter_distrain.client import standby
    from jupyter_distrain.client.follow import follow

    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "1")
    spec = JobSpec(code=SHORT, workers=2, backend="plain", **cluster.options())
    try:
        follow(api.submit(spec), stream=False)
        ready = standby.standby_pid()
        assert ready is not None
        maps = Path(f"/proc/{ready}/maps")
        assert wait_for(lambda: "_raylet" in maps.read_text(), 60, what="ray imported")
        second = api.submit(spec)
        assert second.wait(60) == "succeeded", second.status().error
        assert second.dir.read_control().warden_pid == ready
    finally:
        standby.discard()
    assert leftovers(driver, second.id) == []


def test_ray_is_imported_without_the_iri_grammar_which_stays_importable(tmp_path):
    """The supervisor and the probe import Ray without jsonschema's optional IRI check
    (rfc3987_syntax builds a grammar at import: 1.3 s of 2 s here); Ray works, and the
    module can still be imported afterwards by whoever wants it."""
    script = (
        "import sys\n"
        "from jupyter_distrain.launchers.ray.probe import import_ray\n"
        "ray = import_ray()\n"
        "print('skipped', 'rfc3987_syntax' not in sys.modules)\n"
        "import importlib.util, jsonschema._format\n"
        "if importlib.util.find_spec('rfc3987_syntax') is None:\n"  # a jsonschema without it
        "    print('importable rfc3987_syntax (not installed)')\n"
        "else:\n"
        "    import rfc3987_syntax\n"
        "    print('importable', rfc3987_syntax.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "skipped True" in done.stdout and "importable rfc3987_syntax" in done.stdout
