"""The Slurm launcher on a real Slurm cluster (munged, slurmctld here, two slurmd nodes
each in a network namespace of its own, two CPUs each: tests/slurmcluster.py), started
once for the module: Horovod over Gloo, torch DDP and the seed's ps program across the
two nodes; Stop, a killed rank, a killed supervisor and a step that cannot start each
leaving nothing in Slurm's queue or on either node; a job inside the notebook's own
allocation; an impossible request refused before anything is submitted; a job held
pending showing Slurm's reason, cancelled by Stop and by its queue limit."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    TORCH_STACKS_PROGRAM,
    check_torch_stacks,
    check_went_on_without,
    restart_after_killing_rank_1,
    shrinking_spec,
    wait_for,
)
from netprobe import flooding
from slurmcluster import CONTROLLER_ADDRESS, SlurmCluster, slurm_cluster
from test_ray import (
    COUNTING,
    ENDLESS,
    HOROVOD_PROGRAM,
    assert_nothing_handed_is_in,
    handed_job,
    stop_jobs,  # noqa: F401  (autouse: what a test left running is stopped)
)
from test_session import check_a_session_across
from test_tf_backends import SEED_PROGRAM
from test_torch import DDP_PROGRAM
from test_torch import SAID as DDP_SAID
from test_users import WHOAMI, submit_as
from useraccounts import ALICE, reachable_by

from jupyter_distrain.client import api
from jupyter_distrain.client.job import Job, JobFailed
from jupyter_distrain.contract import control
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import JobSpec, SpecError
from jupyter_distrain.contract.store import JobDir, list_job_dirs
from jupyter_distrain.launchers.slurm.step import PIECE_BYTES, Pieces

pytestmark = pytest.mark.root  # the hosts are network namespaces

NODES = {"jdsn1": "10.234.0.11", "jdsn2": "10.234.0.12"}


# The nodes' job directories from before this module's cluster started (an earlier run
# on this machine, interrupted, left them): not this run's to answer for
EARLIER_DIRS: set[Path] = set()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    EARLIER_DIRS.update(Path.home().glob(".jupyter_distrain/slurm/*"))
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def nothing_left(cluster: SlurmCluster, seconds: float = 15, dirs: bool = True) -> None:
    """Slurm's queue is empty, neither node runs anything but slurmd and (``dirs``) no job
    of this run has a directory left on them (within ``seconds``)."""

    def left() -> list[str]:
        procs = []
        for node in cluster.nodes:
            for proc in node.job_processes():
                with contextlib.suppress(psutil.NoSuchProcess):  # it ended since it was listed
                    procs.append(f"{node.name}: {proc.name()} {proc.pid}")
        found = set(Path.home().glob(".jupyter_distrain/slurm/*")) - EARLIER_DIRS if dirs else ()
        return cluster.queue() + procs + sorted(str(d) for d in found)

    deadline = time.monotonic() + seconds
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == []


def node_dirs(job_id: str) -> list[Path]:
    """The job's directories on the nodes (they share this machine's file system)."""
    return list(Path.home().glob(f".jupyter_distrain/slurm/{job_id}"))


def log_of(job: Job, index: int) -> str:
    """Worker ``index``'s log so far ("" before it has one)."""
    try:
        return job.logs(ProcessId("worker", index))
    except KeyError:
        return ""


def test_pieces_of_srun_lines_are_put_together_per_task():
    pieces = Pieces()
    cut = [b"0: " + b"a" * PIECE_BYTES + b"\n", b"1: one\n", b"0: b\n"]
    assert [pieces.line(raw) for raw in cut] == [
        None,
        (1, b"one\n"),
        (0, b"a" * PIECE_BYTES + b"b\n"),
    ]
    exact = [b"0: " + b"c" * PIECE_BYTES + b"\n", b"0: \n"]  # a line of exactly 1024 bytes
    assert [pieces.line(raw) for raw in exact] == [None, (0, b"c" * PIECE_BYTES + b"\n")]
    assert pieces.line(b"srun: error: jdsn2: task 1: Killed\n") is None
    assert pieces.own == b"srun: error: jdsn2: task 1: Killed\n"


def test_srun_runs_on_both_nodes(cluster):
    done = cluster.run("srun", "--nodes=2", "--ntasks=2", "hostname")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(NODES)
    nothing_left(cluster)


@pytest.mark.horovod
def test_a_horovod_job_runs_one_rank_on_each_node(cluster, jobs_root):
    job = api.submit(
        JobSpec(
            code=HOROVOD_PROGRAM,
            workers=2,
            backend="horovod",
            out="answer",
            **cluster.options(slurm_nodes=2),
        )
    )
    assert any(n.startswith("Slurm: partition jdtest, nodes jdsn1, jdsn2") for n in job.notes)
    assert job.wait(180) == "succeeded", job.status().error
    logs = {i: job.logs(ProcessId("worker", i)) for i in (0, 1)}
    said = {i: re.search(r"rank (\d) size (\d) sum ([\d.]+) at ([\d.]+)", logs[i]) for i in (0, 1)}
    assert all(said.values()), logs
    assert {m.group(2) for m in said.values()} == {"2"}  # hvd.size() == 2
    assert {m.group(3) for m in said.values()} == {"3.0"}
    assert {m.group(4) for m in said.values()} == set(NODES.values())  # one rank per node
    status = job.status()
    assert {p.address for p in status.processes} == set(NODES.values())
    assert all(p.pid > 0 for p in status.processes)
    assert job.result() == (0, 2, said[0].group(4))  # result.pkl came back from its node
    # the channels listen on TCP on this machine's address towards the nodes, only there
    control = job.dir.read_control()
    assert control.address.startswith(f"tcp:{CONTROLLER_ADDRESS}:")
    assert control.metrics.startswith(f"tcp://{CONTROLLER_ADDRESS}:")
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_a_torch_ddp_job_runs_one_rank_on_each_node(cluster, jobs_root):
    job = api.submit(
        JobSpec(code=DDP_PROGRAM, workers=2, backend="torch", **cluster.options(slurm_nodes=2))
    )
    assert job.wait(240) == "succeeded", job.status().error
    said = [DDP_SAID.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert [m.group(2) for m in said] == ["2", "2"]  # world size
    rank0 = next(p.address for p in job.status().processes if p.index == 0)
    assert {m.group(4) for m in said} == {rank0}  # MASTER_ADDR: rank 0's node address
    assert said[0].group(5) == said[1].group(5)  # identical weights
    assert {p.address for p in job.status().processes} == set(NODES.values())
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_a_torch_session_on_two_nodes_keeps_its_state_and_survives_an_interrupt(
    cluster, kernel, jobs_root
):
    job = check_a_session_across(kernel, f"{cluster.flags()} --nodes 2", jobs_root, node_dirs)
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_a_task_gets_the_jobs_environment_not_the_kernels(cluster, jobs_root, monkeypatch):
    # srun exported the kernel's whole environment: a JupyterHub token or cloud keys
    # reached every node and every rank (ssh and Ray send only the job's --env)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "the-kernels-token")
    code = "import os\nprint('token', os.environ.get('JUPYTERHUB_API_TOKEN'), 'setting', os.environ.get('JOB_SETTING'))\n"
    job = api.submit(
        JobSpec(
            code=code,
            workers=2,
            backend="plain",
            env={"JOB_SETTING": "x"},
            **cluster.options(slurm_nodes=2),
        )
    )
    assert job.wait(120) == "succeeded", job.status().error
    assert [log_of(job, i).strip().splitlines()[-1] for i in (0, 1)] == ["token None setting x"] * 2
    nothing_left(cluster)


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def few_open_files():
    """This process (and so the job's supervisor it starts) at the usual soft limit of
    1024 open files, the hard limit kept; yields the hard limit."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, before[1]))
    yield before[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def request_as_the_kernel_does(info: control.ControlInfo, body: dict) -> dict:
    """The reply to a control request sent again while a newer connection pushed it out
    unanswered (``Job._tell``: a flood from the kernel's own address can)."""
    replies: list[dict] = []
    wait_for(
        lambda: (
            replies.append(control.request(info.address, info.secret, body))
            or replies[-1].get("error") != control.NO_REPLY
        ),
        30,
        what="a control request answered",
    )
    return replies[-1]


def test_unauthenticated_connections_cannot_run_the_supervisor_out_of_files(
    cluster, jobs_root, few_open_files
):
    """Connections that never authenticate, held to the channels' TCP endpoints (open to
    the nodes' network) against a supervisor started at a soft limit of 1024: it raised
    its own limit, so the metrics channel holds 1100 and more while the kernel's requests
    are answered; the control channel drops them for newer ones (its listen backlog lets
    fewer in); the job goes on and ends as it would."""
    # the ranks tick until the test releases them (the nodes share this file system): a
    # fixed number of ticks ended the job, and its supervisor, before a slow flood filled up
    released = jobs_root / "released"
    ticking = (
        "import os, time\ni = 0\n"
        f"while not os.path.exists({str(released)!r}) and i < 600:\n"
        "    print('step', i, flush=True)\n    time.sleep(1)\n    i += 1\n"
        "print('released', flush=True)\n"
    )
    job = api.submit(
        JobSpec(code=ticking, workers=2, backend="plain", **cluster.options(slurm_nodes=2))
    )
    wait_for(
        lambda: all("step 2" in log_of(job, i) for i in (0, 1)), 120, what="both ranks running"
    )
    info = job.dir.read_control()
    supervisor = psutil.Process(info.pid)
    assert supervisor.rlimit(psutil.RLIMIT_NOFILE)[0] == few_open_files

    def held() -> int:
        assert supervisor.is_running(), job.dir.supervisor_log.read_text()[-2000:]
        return _open_files(info.pid)

    with flooding(info.metrics, 2000, 8) as opened:
        wait_for(lambda: held() > 1100, 60, what="1100 connections held")
        # the kernel's requests still reach the supervisor
        assert control.request(info.address, info.secret, {"op": "status"})["ok"]
    assert opened[0] >= 1100
    # from the kernel's own address: it held every slot that address could take
    with flooding(info.address, 200, 4) as opened:  # each taken, then dropped for a newer
        time.sleep(2)
        assert request_as_the_kernel_does(info, {"op": "status"})["ok"]
    assert opened[0] > control.MAX_CONNECTIONS
    released.touch()
    assert job.wait(60) == "succeeded", job.status().error
    assert all(log_of(job, i).rstrip().endswith("released") for i in (0, 1))
    assert "Too many open files" not in job.dir.supervisor_log.read_text()
    nothing_left(cluster)


def test_an_ordinary_user_submits_a_job_that_runs_as_her_on_both_nodes(cluster):
    """distrain-alice submits from her own account (root only lets her read the test
    cluster's configuration and reach its munge socket, which a real cluster's are):
    munge vouches for her uid, each node runs her task as her, and once it ends neither
    the queue, the nodes nor her home keep anything of it."""
    munge = cluster.base / "munge" / "munge.socket"
    with reachable_by(ALICE, cluster.conf), reachable_by(ALICE, munge, "rw"):
        outcome = submit_as(
            ALICE,
            env={"SLURM_CONF": str(cluster.conf)},
            code=WHOAMI,
            backend="plain",
            **cluster.options(slurm_nodes=2),
        )
    assert outcome["state"] == "succeeded", outcome["error"]
    lines = sorted(line for log in outcome["logs"].values() for line in log.splitlines())
    assert lines == [f"user {ALICE} on jdsn1", f"user {ALICE} on jdsn2"], outcome["logs"]
    nothing_left(cluster)
    hers = Path(os.path.expanduser(f"~{ALICE}")) / ".jupyter_distrain" / "slurm" / outcome["id"]
    assert not hers.exists()


def test_a_parameter_server_job_runs_across_the_nodes(cluster, jobs_root):
    """The seed's program with 1 ps and 2 workers: three tasks over the two nodes."""
    job = api.submit(
        JobSpec(
            code="SYNC = False\n" + SEED_PROGRAM, workers=2, ps=1, backend="ps", **cluster.options()
        )
    )
    assert job.wait(240) == "succeeded", job.status().error
    match = re.search(r"final global_step (\d+) accuracy", job.logs(ProcessId("worker", 0)))
    assert match and int(match.group(1)) >= 40
    assert {p.address for p in job.status().processes} == set(NODES.values())
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_a_tf_collective_job_runs_across_the_nodes(cluster, jobs_root):
    """MultiWorkerMirroredStrategy: TF_CONFIG names each task's node address."""
    code = (
        "import tensorflow as tf\n"
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "total = strategy.reduce('SUM', strategy.run(lambda: tf.constant(2.0)), axis=None)\n"
        "print(f'replicas {strategy.num_replicas_in_sync} total {float(total)}')\n"
    )
    job = api.submit(JobSpec(code=code, workers=2, backend="tf", **cluster.options(slurm_nodes=2)))
    assert job.wait(240) == "succeeded", job.status().error
    for index in (0, 1):
        assert "replicas 2 total 4.0" in job.logs(ProcessId("worker", index))
    assert {p.address for p in job.status().processes} == set(NODES.values())
    nothing_left(cluster)


def test_a_scale_from_2_to_3_resumes_from_the_checkpoint_in_a_new_allocation(cluster, jobs_root):
    job = api.submit(JobSpec(code=COUNTING, workers=2, backend="plain", **cluster.options()))
    wait_for(lambda: "step 4" in log_of(job, 0) or job.done, 60, what="steps")
    (first,) = cluster.queue()
    job.scale(3)  # SIGUSR1 through the agents; the checkpoint comes back, then out again
    assert job.wait(120) == "succeeded", job.status().error
    resumed = re.findall(r"rank (\d) starts at (\d+)", "".join(log_of(job, i) for i in range(3)))
    later = [(rank, int(at)) for rank, at in resumed if at != "0"]
    assert sorted(rank for rank, at in resumed if at == "0") == ["0", "1"], resumed
    assert sorted(rank for rank, _ in later) == ["0", "1", "2"], resumed
    assert len({at for _, at in later}) == 1 and later[0][1] >= 5, resumed
    assert len(job.status().processes) == 3
    assert {p.address for p in job.status().processes} == set(NODES.values())
    assert first.split()[0] not in " ".join(cluster.queue())
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_an_interrupt_in_the_kernel_ends_the_slurm_job_and_leaves_nothing(
    cluster, kernel, jobs_root
):
    cell = f"%%distributed --workers 2 --backend plain {cluster.flags()} --nodes 2\n" + ENDLESS
    msg_id = kernel.submit(cell)
    job_dir: JobDir = wait_for(lambda: list_job_dirs(jobs_root), 30, what="the job")[0]
    job = Job(job_dir)
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    assert len(cluster.queue()) == 1 and not job.done
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] in ("KeyboardInterrupt", "JobInterrupted")
    nothing_left(cluster)
    assert job_dir.read_state().state == "stopped"
    assert node_dirs(job.id) == []


def test_a_lost_node_fails_the_job_naming_it_and_leaves_nothing(cluster, jobs_root):
    """slurmd, its step daemon and the rank on jdsn2 killed at once (the machine went
    down): srun would notice only after Slurm's SlurmdTimeout (300 s), but the task's
    agent falls silent, so the job fails within seconds naming the node (torch's rule:
    every rank must succeed), its allocation is cancelled, and once the node is back
    nothing of the job is left anywhere."""
    job = api.submit(
        JobSpec(code=ENDLESS, workers=2, backend="torch", **cluster.options(slurm_nodes=2))
    )
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    assert not job.done, job.status().error
    lost = cluster.node("jdsn2")
    try:
        lost.lose()
        lost_at = time.monotonic()
        with pytest.raises(JobFailed, match=r"rank 1 on host jdsn2 failed first"):
            job.wait(90)
        failed = next(e["time"] for e in job.dir.read_events() if e["event"] == "exit")
        assert failed - time.time() + time.monotonic() - lost_at < 15
        assert "lost task 1 on jdsn2: nothing heard from it for 10 s" in log_of(job, 1)
    finally:
        if lost.process is None:
            cluster.restart(lost)
    nothing_left(cluster, 60, dirs=False)
    for directory in node_dirs(job.id):  # the lost node's task could not remove its own
        shutil.rmtree(directory)


def test_a_lost_node_is_left_out_under_min_workers_and_the_job_goes_on_with_the_other(
    cluster, jobs_root
):
    """jdsn2 lost (slurmd, its step daemon and the rank killed at once) under
    ``--max-restarts 1 --min-workers 1``: the next generation asks Slurm for one node,
    excluding jdsn2 (Slurm still counts it up for 300 s), resumes on jdsn1 from the last
    periodic checkpoint brought back from there, and succeeds."""
    job = api.submit(shrinking_spec(**cluster.options(slurm_nodes=2)))
    lost = cluster.node("jdsn2")
    try:
        wait_for(lambda: "step 20" in log_of(job, 1) or job.done, 90, what="step 20")
        assert not job.done, job.status().error
        lost.lose()
        assert job.wait(180) == "succeeded", job.status().error
        assert {p.address for p in job.status().processes} == {NODES["jdsn1"]}
    finally:
        if lost.process is None:
            cluster.restart(lost)
    check_went_on_without(job, "jdsn2")
    nothing_left(cluster, 60, dirs=False)
    for directory in node_dirs(job.id):  # the lost node's task could not remove its own
        shutil.rmtree(directory)


def test_stop_ends_the_slurm_job_and_leaves_nothing_on_either_node(cluster, jobs_root):
    """Also: while it runs, nothing listens on a node but slurmd, and no file of a task's
    directory holds the job's secret, a pushed value or an --env value: they are handed
    to each process in memory (through srun's stdin), and the job works with them."""
    job = handed_job(**cluster.options(slurm_nodes=2))
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    assert not job.done, job.status().error
    assert "pushed pushed-value-5678 env-value-1234" in log_of(job, 1)
    assert len(cluster.queue()) == 1 and cluster.queue()[0].endswith("RUNNING")
    for node in cluster.nodes:  # the tasks and agents listen on nothing
        assert node.listening() == ["slurmd 0.0.0.0:6818"], node.listening()
    assert len(node_dirs(job.id)) == 1  # the job's, with a directory per task
    assert_nothing_handed_is_in(node_dirs(job.id), job)
    assert job.stop() == "stopped"
    nothing_left(cluster)
    assert node_dirs(job.id) == []


def test_the_stacks_of_ddp_ranks_on_two_nodes_show_where_each_stands(cluster, jobs_root):
    spec = JobSpec(
        code=TORCH_STACKS_PROGRAM, workers=2, backend="torch", **cluster.options(slurm_nodes=2)
    )
    job = api.submit(spec)
    report = check_torch_stacks(job, 2)
    assert {p.host for p in report.processes} == set(NODES)
    assert job.stop() == "stopped"
    nothing_left(cluster)


def test_inside_an_allocation_the_job_runs_a_step_there_and_leaves_the_allocation(
    cluster, jobs_root, monkeypatch
):
    """A notebook started inside an allocation (SLURM_JOB_ID): no new one is asked for,
    the job is a step of that one, and at its end the allocation is still there."""
    held = cluster.run("salloc", "--no-shell", "--nodes=2", "--ntasks=2")
    allocation = re.search(r"Granted job allocation (\d+)", held.stderr)
    assert allocation, held.stderr
    try:
        monkeypatch.setenv("SLURM_JOB_ID", allocation[1])
        long_line = 'print("x" * 3000, flush=True)\n'  # srun cuts it at 1024 bytes
        job = api.submit(
            JobSpec(code=long_line + ENDLESS, workers=2, backend="plain", **cluster.options())
        )
        assert f"Slurm: this notebook's allocation {allocation[1]}, nodes jdsn1, jdsn2" in job.notes
        wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
        assert cluster.queue() == [f"{allocation[1]} RUNNING"]  # no other job was asked for
        assert "\n" + "x" * 3000 + "\nstep 0\n" in "\n" + log_of(job, 0)  # put together again
        assert {p.address for p in job.status().processes} == set(NODES.values())
        assert job.stop() == "stopped"
        wait_for(lambda: not any(n.job_processes() for n in cluster.nodes), 15, what="the step")
        assert cluster.queue() == [f"{allocation[1]} RUNNING"]
        steps = cluster.run("squeue", "--noheader", "--steps", f"--jobs={allocation[1]}")
        assert steps.stdout.strip() == ""
    finally:
        cluster.run("scancel", allocation[1])
    nothing_left(cluster)


def test_a_lost_supervisor_leaves_no_allocation_and_nothing_on_either_node(cluster, jobs_root):
    """SIGKILL to the supervisor: srun's and salloc's stdin end with it, so the tasks hang
    up their agents (which kill their processes) and salloc gives the allocation up."""
    job = api.submit(
        JobSpec(code=ENDLESS, workers=2, backend="plain", **cluster.options(slurm_nodes=2))
    )
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    assert not job.done, job.status().error
    os.kill(job.status().supervisor_pid, signal.SIGKILL)
    # The tasks' directories are removed there only where the allocation still takes
    # the warden's clean-up step (often it has ended by then); the notebook's next job
    # on the nodes removes what is left (its tasks' sweep)
    nothing_left(cluster, 20, dirs=False)
    with pytest.raises(JobFailed, match="the supervisor was lost"):
        job.wait(30)
    later = api.submit(
        JobSpec(code="print('later')", workers=2, backend="plain", **cluster.options(slurm_nodes=2))
    )
    assert later.wait(60) == "succeeded", later.status().error
    assert node_dirs(job.id) == []


def test_a_job_cancelled_from_outside_fails_saying_so_and_leaves_nothing(cluster, jobs_root):
    job = api.submit(
        JobSpec(code=ENDLESS, workers=2, backend="plain", **cluster.options(slurm_nodes=2))
    )
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    (line,) = cluster.queue()
    assert cluster.run("scancel", line.split()[0]).returncode == 0
    with pytest.raises(JobFailed, match=r"failed first \(exit code 255\)"):
        job.wait(30)
    assert re.search(
        r"lost task \d on jdsn\d: Slurm job \d+ is (CANCELLED|COMPLETING)", job.status().error_tail
    )
    nothing_left(cluster)


def test_a_killed_task_fails_the_job_fast_and_leaves_nothing(cluster, jobs_root):
    """torch's rule (every rank must succeed): one rank killed on its node ends the job,
    its Slurm job and the other rank."""
    job = api.submit(
        JobSpec(code=ENDLESS, workers=2, backend="torch", **cluster.options(slurm_nodes=2))
    )
    wait_for(lambda: "step 3" in log_of(job, 1) or job.done, 60, what="steps")
    assert not job.done, job.status().error
    worker = next(p for p in job.status().processes if p.index == 1)
    node = next(n for n in cluster.nodes if NODES[n.name] == worker.address)
    assert worker.pid in [p.pid for p in node.job_processes()]
    killed = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)  # one file system and pid space: it is this pid
    node_name = node.name
    with pytest.raises(
        JobFailed, match=rf"rank 1 on host {node_name} failed first \(killed by SIGKILL\)"
    ):
        job.wait(30)
    assert time.monotonic() - killed < 15
    nothing_left(cluster)
    assert not psutil.pid_exists(worker.pid)


def test_a_killed_task_with_a_restart_left_restarts_the_job_in_a_new_allocation(cluster, jobs_root):
    """``--max-restarts 1``: the killed rank ends that generation (its Slurm job too) and
    the next runs in a new allocation, both ranks from the start; a stop then leaves
    nothing."""
    spec = JobSpec(
        code=ENDLESS,
        workers=2,
        backend="torch",
        max_restarts=1,
        grace=1,
        **cluster.options(slurm_nodes=2),
    )
    job = api.submit(spec)
    said = restart_after_killing_rank_1(job, "step 3")
    assert said.startswith("restart 1 of 1 after rank 1 on host jdsn"), said
    assert "(killed by SIGKILL)" in said
    wait_for(lambda: log_of(job, 1).count("step 3\n") == 2, 60, what="rank 1 stepping again")
    assert len(cluster.queue()) == 1  # the first allocation is gone, the new one runs
    assert job.stop() == "stopped"
    nothing_left(cluster)


def test_an_impossible_request_is_refused_at_submit_and_nothing_is_submitted(cluster, jobs_root):
    with pytest.raises(SpecError) as refused:
        api.submit(JobSpec(code=ENDLESS, workers=5, backend="plain", cpu=1, **cluster.options()))
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(
        "--launcher slurm: partition jdtest (it has jdsn1 (2 CPUs), jdsn2 (2 CPUs)) cannot run 5 tasks of 1 CPU"
    ), said
    assert "Requested node configuration is not available" in said
    assert list_job_dirs(jobs_root) == []
    assert cluster.queue() == []
    with pytest.raises(SpecError, match="partition nope .*no such partition"):
        api.submit(
            JobSpec(
                code=ENDLESS, workers=1, backend="plain", launcher="slurm", slurm_partition="nope"
            )
        )


def test_a_step_that_cannot_start_fails_the_job_in_one_line_and_leaves_nothing(cluster, jobs_root):
    job = api.submit(
        JobSpec(
            code=ENDLESS,
            workers=2,
            backend="plain",
            **cluster.options(remote_python="/nowhere/python"),
        )
    )
    with pytest.raises(JobFailed):
        job.wait(60)
    said = job.status().error
    assert "\n" not in said and said.startswith("StepError: the Slurm step did not start: "), said
    assert "/nowhere/python" in said, said  # slurmstepd's execve() error, from the task
    nothing_left(cluster)


def test_a_pending_job_shows_slurms_reason_and_is_cancelled_by_stop_or_its_queue_limit(
    cluster, jobs_root
):
    """Both nodes held by another Slurm job: ours waits and says why; Stop cancels it,
    and so does --queue-timeout."""
    holder = cluster.run(
        "sbatch", "--nodes=2", "--ntasks=4", "--output=/dev/null", "--wrap=sleep 300"
    )
    assert holder.returncode == 0, holder.stderr
    pending = r"pending in Slurm queue: (Resources|Priority) \(job \d+\)"
    try:
        job = api.submit(JobSpec(code=ENDLESS, workers=2, backend="plain", **cluster.options()))
        wait_for(lambda: job.status().warnings, 30, what="the pending line")
        assert re.fullmatch(pending, job.status().warnings[0]), job.status().warnings
        assert len(cluster.queue()) == 2
        assert job.stop() == "stopped"
        wait_for(lambda: len(cluster.queue()) == 1, 15, what="the pending job cancelled")
        limited = api.submit(
            JobSpec(
                code=ENDLESS, workers=2, backend="plain", **cluster.options(slurm_queue_timeout=3.0)
            )
        )
        with pytest.raises(JobFailed, match=r"after 3 s \(--queue-timeout\): cancelled"):
            limited.wait(60)
        assert re.fullmatch(pending, limited.status().warnings[0]), limited.status().warnings
        assert len(cluster.queue()) == 1
    finally:
        cluster.run("scancel", holder.stdout.split()[-1])
    nothing_left(cluster)
