"""The ssh launcher on two real hosts (network namespaces running Debian's sshd on port
2222, tests/multihost.py): Horovod, parameter-server and tf jobs across them, bad input
refused before anything starts, and faults on one host leaving nothing running anywhere."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    TORCH_STACKS_PROGRAM,
    check_torch_stacks,
    check_went_on_without,
    fault_row,
    restart_after_killing_rank_1,
    shrinking_spec,
    wait_for,
)
from jobscan import left_after
from jobscan import processes_naming as job_processes
from multihost import SSH_PORT, SshCluster, kill_inside, namespace_pids, ssh_cluster
from netprobe import listening_sockets
from test_jax import ALLGATHER, GATHERED
from test_metrics_widget import KERAS_FIT
from test_mpi import AVERAGING, MPI_SESSION
from test_mpi import SAID as MPI_SAID
from test_session import check_a_session_across, check_backend_session
from test_tf_backends import SEED_PROGRAM
from test_torch import DDP_PROGRAM, RESTARTING, ddp_rerun_from_the_pool
from test_torch import SAID as DDP_SAID
from test_users import WHOAMI, submit_as
from useraccounts import ALICE, run_as

import jupyter_distrain
from jupyter_distrain.client import api
from jupyter_distrain.client.cml import run_cluster
from jupyter_distrain.client.commands import print_pools
from jupyter_distrain.client.job import Job
from jupyter_distrain.client.widget import JobWidget
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import JobSpec, SpecError
from jupyter_distrain.contract.store import list_job_dirs
from jupyter_distrain.launchers.agent.host import PROTOCOL
from jupyter_distrain.launchers.ssh.connection import AGENT_MODULE, SshOptions
from jupyter_distrain.launchers.ssh.pools import host_pools
from jupyter_distrain.launchers.ssh.preflight import REMOTE_ROOT

pytestmark = pytest.mark.root  # the hosts are network namespaces

HOROVOD_KERAS = """\
import os
import numpy as np
import horovod.tensorflow.keras as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
address = os.environ["JUPYTER_DISTRAIN_ADDRESS"]
print(f"rank {hvd.rank()} size {hvd.size()} sum {float(total)} at {address}")
x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), "binary_crossentropy")
model.fit(x, y, batch_size=32, epochs=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
result = (hvd.rank(), hvd.size(), address)
"""

ENDLESS_HOROVOD = """\
import time
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
step = 0
while True:
    hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ssh_cluster(tmp_path_factory.mktemp("hosts")) as made:
        yield made


def ssh_masters(kept: bool = False) -> list[psutil.Process]:
    """ssh master connections a job opened for itself (the launcher's are named by no
    job id); with ``kept``, also those kept for the next jobs (:mod:`...ssh.kept`)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            persist = [a for a in proc.info["cmdline"] or [] if a.startswith("ControlPersist=")]
            if persist and (kept or persist == ["ControlPersist=yes"]):
                found.append(proc)
    return found


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie too: a daemonized master's parent is the
    nearest subreaper, this test process once a test made it one)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ssh_connections(host) -> int:
    """How many ssh connections ``host``'s sshd holds."""
    out = host.run("ss", "-Htn", "state", "established", f"( sport = :{SSH_PORT} )").stdout
    return len(out.splitlines())


def forwarded_sockets(host) -> list[str]:
    """The Unix sockets sshd listens on in ``host`` (forwards to the notebook machine)."""
    out = host.run("ss", "-Hxlp").stdout
    return [line for line in out.splitlines() if '"sshd"' in line]


def orted_daemons() -> list[psutil.Process]:
    """OpenMPI's daemons (mpirun starts them on the hosts; a local mpirun needs none)."""
    return [
        p
        for p in psutil.process_iter(["name", "status"])
        if p.info["name"] == "orted" and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def wait_until_gone(job_id: str, seconds: float) -> list[psutil.Process]:
    """What is left of the job (ssh master connections and OpenMPI daemons included)
    after ``seconds``."""
    return left_after(lambda: job_processes(job_id) + ssh_masters() + orted_daemons(), seconds)


def remote_dirs(job_id: str) -> list[Path]:
    return list(Path.home().glob(f".jupyter_distrain/jobs/{job_id}*"))


def only_job(root: Path) -> Job:
    (job_dir,) = list_job_dirs(root)
    return Job(job_dir)


@pytest.mark.horovod
def test_a_horovod_keras_job_runs_across_two_hosts(kernel, cluster, jobs_root):
    cell = f"%%distributed --workers 2 {cluster.flags()} --out answer\n" + HOROVOD_KERAS
    out = kernel.execute(cell)
    assert out.error is None, out.error_text + out.stdout[-3000:]
    assert "[0] rank 0 size 2 sum 3.0 at 10.232.0.11" in out.stdout
    assert "[1] rank 1 size 2 sum 3.0 at 10.232.0.12" in out.stdout
    hosts = "10.232.0.11 (jdeth0, 1 slot), 10.232.0.12 (jdeth0, 1 slot)"
    assert f"Hosts checked: {hosts}" in out.stdout
    assert kernel.execute("print(answer)").stdout.strip() == "(0, 2, '10.232.0.11')"
    job = only_job(jobs_root)
    status = job.status()
    assert {(p.index, p.host, p.address) for p in status.processes} == {
        (0, "jdh1", "10.232.0.11"),
        (1, "jdh2", "10.232.0.12"),
    }
    # the metrics came back through the forwarded sockets, from both hosts
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    assert {r["index"] for r in records if r.get("step")} == {0, 1}
    assert "rank 1 size 2" in job.logs(ProcessId("worker", 1))
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


@pytest.mark.horovod
def test_a_horovod_mpi_job_runs_across_two_hosts(kernel, cluster, jobs_root):
    code = (
        "import socket\n"
        "import horovod.tensorflow as hvd\n"
        "import tensorflow as tf\n"
        "hvd.init()\n"
        "total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)\n"
        "print(f'rank {hvd.rank()} size {hvd.size()} sum {float(total)} on "
        "{socket.gethostname()} mpi {hvd.mpi_enabled()}')\n"
    )
    out = kernel.execute(f"%%distributed --workers 2 --controller mpi {cluster.flags()}\n" + code)
    assert out.error is None, out.error_text + out.stdout[-3000:]
    assert "[0] rank 0 size 2 sum 3.0 on jdh1 mpi True" in out.stdout
    assert "[1] rank 1 size 2 sum 3.0 on jdh2 mpi True" in out.stdout
    job = only_job(jobs_root)
    assert [(p.index, p.host) for p in job.status().processes] == [(0, "jdh1"), (1, "jdh2")]
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


def test_the_seed_sync_replicas_program_runs_across_hosts_through_run_cluster(
    cluster, jobs_root, tmp_path
):
    script = tmp_path / "train.py"
    script.write_text("SYNC = True\n" + SEED_PROGRAM)
    cluster_spec, session_addr = run_cluster(
        n_workers=2, n_ps=1, worker_script=str(script), **cluster.options(slots=2)
    )
    addresses = {a.rpartition(":")[0] for tasks in cluster_spec.values() for a in tasks}
    assert addresses == {"10.232.0.11", "10.232.0.12"}
    assert session_addr == f"grpc://{cluster_spec['worker'][0]}"
    job = only_job(jobs_root)
    assert job.wait(180) == "succeeded"
    match = re.search(
        r"final global_step (\d+) accuracy ([\d.]+)", job.logs(ProcessId("worker", 0))
    )
    assert match and int(match.group(1)) == 40 and float(match.group(2)) >= 0.8
    assert {p.host for p in job.status().processes} == {"jdh1", "jdh2"}


def test_a_tf_collective_job_runs_across_hosts(cluster, jobs_root):
    code = (
        "import tensorflow as tf\n"
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "with strategy.scope():\n"
        "    v = tf.Variable(1.0)\n"
        "total = strategy.reduce('SUM', strategy.run(lambda: tf.constant(2.0)), axis=None)\n"
        "print(f'replicas {strategy.num_replicas_in_sync} total {float(total)}')\n"
    )
    job = api.submit(JobSpec(code=code, workers=2, backend="tf", **cluster.options()))
    widget = JobWidget(job)
    assert job.wait(180) == "succeeded"
    widget.refresh(force=True)  # the widget says which hosts the pre-flight checked
    assert "Hosts checked: 10.232.0.11 (jdeth0, 1 slot), 10.232.0.12" in widget.header.value
    for index in (0, 1):
        assert "replicas 2 total 4.0" in job.logs(ProcessId("worker", index))


def test_a_torch_ddp_job_runs_one_rank_on_each_host(cluster, jobs_root):
    """torchrun's environment across hosts: MASTER_ADDR is rank 0's host address on the
    hosts' network, each host a node of its own; the ranks end with identical weights."""
    job = api.submit(JobSpec(code=DDP_PROGRAM, workers=2, backend="torch", **cluster.options()))
    assert job.wait(240) == "succeeded", job.status().error
    said = [DDP_SAID.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert [m.group(3) for m in said] == [
        "LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0",
        "LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=1",
    ]
    assert {m.group(4) for m in said} == {"10.232.0.11"}  # rank 0's host, never a name
    assert said[0].group(5) == said[1].group(5)
    assert [p.host for p in job.status().processes] == ["jdh1", "jdh2"]
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


def test_a_torch_session_on_two_hosts_keeps_its_state_and_survives_an_interrupt(
    kernel, cluster, jobs_root
):
    job = check_a_session_across(kernel, cluster.flags(), jobs_root)
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


def test_an_mpi_session_on_two_hosts_gets_its_cells_through_the_hosts_guards(
    kernel, cluster, jobs_root
):
    """mpirun's ranks on another host have no agent of their own: the host's guard
    session writes the cells there and relays the interrupt."""
    job = check_backend_session(kernel, jobs_root, "mpi", *MPI_SESSION, flags=cluster.flags())
    assert [p.host for p in job.status().processes] == ["jdh1", "jdh2"]
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


JAX_GATHER_AND_WAIT = ALLGATHER + "import time\ntime.sleep(600)\n"


@pytest.mark.jax
def test_a_jax_job_runs_one_process_on_each_host(cluster, jobs_root):
    """jax.distributed across hosts: the coordinator is rank 0's host address on the
    hosts' network and listens there only; Gloo's connections are on that interface;
    Stop leaves nothing on either host."""
    job = api.submit(
        JobSpec(code=JAX_GATHER_AND_WAIT, workers=2, backend="jax", **cluster.options())
    )
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in (0, 1)]
    said = lambda i: logs[i].exists() and GATHERED.search(logs[i].read_text())  # noqa: E731
    wait_for(lambda: (said(0) and said(1)) or job.done, 180, what="both processes' gather")
    assert [said(i).group(1, 2, 3) for i in (0, 1)] == [
        ("0", "2", "[1, 11]"),
        ("1", "2", "[1, 11]"),
    ]
    coordinator = job.status().backend_info["coordinator"]
    address, _, port = coordinator.rpartition(":")
    assert address == "10.232.0.11" and said(1).group(5) == coordinator
    rows = job.status().processes
    assert [p.host for p in rows] == ["jdh1", "jdh2"]
    bound = {a for a, p in listening_sockets(rows[0].pid) if p == int(port)}
    assert bound == {"::ffff:10.232.0.11"}  # not every interface
    for row in rows:  # Gloo listens on the hosts' interface, never on all of them
        assert all(
            a.endswith(("10.232.0.11", "10.232.0.12")) for a, _ in listening_sockets(row.pid)
        )
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


def test_an_mpi4py_job_runs_one_rank_on_each_host(cluster, jobs_root):
    job = api.submit(JobSpec(code=AVERAGING, workers=2, backend="mpi", **cluster.options()))
    assert job.wait(180) == "succeeded", job.status().error
    said = [MPI_SAID.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert said[0].group(3) == said[1].group(3) and float(said[0].group(4)) > 0.85
    assert [(p.index, p.host) for p in job.status().processes if p.role == "worker"] == [
        (0, "jdh1"),
        (1, "jdh2"),
    ]
    assert wait_until_gone(job.id, 10) == []
    assert remote_dirs(job.id) == []


def _refused(cluster: SshCluster, jobs_root: Path, **changes: object) -> str:
    spec = JobSpec(code="print(1)", workers=2, backend="plain", timeout=20)
    options = {**cluster.options(), **changes}
    kept_before = {p.pid for p in ssh_masters(kept=True)}
    started = time.monotonic()
    with pytest.raises(SpecError) as refused:
        api.submit(JobSpec(**{**spec.to_dict(), **options}))
    assert time.monotonic() - started < 20
    assert list_job_dirs(jobs_root) == []  # nothing launched
    opened = left_after(  # nor a connection the refused submit opened
        lambda: [p for p in ssh_masters(kept=True) if p.pid not in kept_before], 5
    )
    assert opened == [], [p.cmdline() for p in opened]
    return str(refused.value)


def test_bad_hosts_are_refused_before_anything_starts(cluster, jobs_root, tmp_path):
    good = cluster.hosts[0].address
    message = _refused(cluster, jobs_root, hosts=f"{good}:1,no-such-host.invalid:1")
    assert "host no-such-host.invalid" in message and "resolve" in message
    assert good not in message  # only the failing host is named
    message = _refused(cluster, jobs_root, ssh_port=SSH_PORT + 1)
    assert "host 10.232.0.11" in message and "host 10.232.0.12" in message
    assert "Connection refused" in message
    message = _refused(cluster, jobs_root, hosts=f"{good}:1")
    assert message == "--hosts offer 1 slots; the job needs 2 processes (--workers 2)"


def test_a_key_the_hosts_do_not_accept_is_refused(cluster, jobs_root, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    message = _refused(cluster, jobs_root, ssh_identity=str(stranger))
    assert "host 10.232.0.11: ssh refused the key" in message


def test_a_host_without_the_package_is_refused(cluster, jobs_root):
    message = _refused(cluster, jobs_root, remote_python="/usr/bin/python3")
    assert "host 10.232.0.11: /usr/bin/python3 cannot import jupyter_distrain" in message
    message = _refused(cluster, jobs_root, remote_python="/nowhere/python")
    assert "host 10.232.0.11: no Python interpreter at /nowhere/python" in message


def test_host_keys_are_checked(cluster, jobs_root, tmp_path):
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    message = _refused(cluster, jobs_root, ssh_known_hosts=str(unknown))
    assert "its host key is not in known_hosts" in message and "--ssh-accept-new-hosts" in message
    # a host whose key changed: known_hosts holds another key for it
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    lines = cluster.known_hosts.read_text().splitlines()
    forged = [
        f"{line.split()[0]} {other.with_suffix('.pub').read_text().split()[0]} "
        f"{other.with_suffix('.pub').read_text().split()[1]}"
        for line in lines[:1]
    ]
    changed = tmp_path / "changed_known_hosts"
    changed.write_text("\n".join(forged + lines[1:]) + "\n")
    message = _refused(cluster, jobs_root, ssh_known_hosts=str(changed))
    assert "host 10.232.0.11: its host key has changed" in message
    assert "10.232.0.12" not in message
    # first contact accepted on request, and recorded
    accepted = tmp_path / "accepted_known_hosts"
    job = api.submit(
        JobSpec(
            code="print('hello')",
            workers=2,
            backend="plain",
            **{**cluster.options(), "ssh_known_hosts": str(accepted)},
            ssh_accept_new_hosts=True,
        )
    )
    assert job.wait(60) == "succeeded"
    assert accepted.read_text().count("ssh-ed25519") == 2


@pytest.mark.horovod
def test_a_host_whose_name_resolves_to_loopback_is_refused_for_horovod(cluster, jobs_root):
    host = cluster.hosts[1]
    host.kill_sshd()
    host.start_sshd(name_address="127.0.1.1")  # Debian's default /etc/hosts entry
    try:
        spec = JobSpec(code="print(1)", workers=2, backend="horovod", timeout=20)
        with pytest.raises(SpecError) as refused:
            api.submit(JobSpec(**{**spec.to_dict(), **cluster.options()}))
        assert "host 10.232.0.12: its name 'jdh2' resolves to 127.0.1.1" in str(refused.value)
        assert "10.232.0.11" not in str(refused.value)
        assert list_job_dirs(jobs_root) == []
        # other backends do not care what the name resolves to
        plain = api.submit(
            JobSpec(code="print(1)", workers=2, backend="plain", **cluster.options())
        )
        assert plain.wait(60) == "succeeded"
    finally:
        host.kill_sshd()
        host.start_sshd()


def test_a_socket_path_too_long_for_a_host_is_refused_naming_the_limit(cluster, jobs_root):
    """The sockets ssh forwards are named by the job (its name: 40 characters at most);
    those of mpirun's guards are in the job's directory, named by the host too."""
    message = _refused(cluster, jobs_root, name="n" * 40)
    assert message.startswith("--hosts: host 10.232.0.11: the job's sockets there (/")
    assert "/.sockets-" in message and "over the 108 a Unix socket's path may have" in message
    host = cluster.hosts[1]
    host.kill_sshd()
    host.start_sshd(hostname="h" * 63)  # the job's directory there is named by the host
    try:
        message = _refused(cluster, jobs_root, backend="horovod", controller="mpi")
        assert message.startswith("--hosts: host 10.232.0.12: the job's sockets there (/")
        assert "over the 108 a Unix socket's path may have" in message
        assert "sshd_config" not in message and "10.232.0.11" not in message
    finally:
        host.kill_sshd()
        host.start_sshd()


def test_ssh_sessions_never_forward_the_users_agent(cluster, tmp_path):
    """A ``ForwardAgent yes`` (here on the command line, as in a user's ssh config) does not
    hand the user's agent to the hosts."""
    socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket)], stdout=subprocess.DEVNULL)
    try:
        wait_for(socket.exists, 10, what="ssh-agent")
        options = SshOptions(SSH_PORT, "", str(cluster.identity), str(cluster.known_hosts))
        shown = ["sh", "-c", "echo agent=${SSH_AUTH_SOCK:-none}"]
        argv = options.ssh_argv(cluster.hosts[0].address, shown, "-o", "ForwardAgent=yes")
        done = subprocess.run(
            argv,
            env={**os.environ, "SSH_AUTH_SOCK": str(socket)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.stdout.strip() == "agent=none", done.stdout + done.stderr
    finally:
        agent.kill()
        agent.wait()


def _running(job: Job, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(KeyError):  # no log yet
            logs = [job.logs(ProcessId("worker", i)) for i in (0, 1)]
            if all("step 2" in log for log in logs):
                return
        assert not job.done, job.status().error
        time.sleep(0.2)
    raise AssertionError("the job did not start stepping")


@pytest.mark.horovod
@pytest.mark.parametrize(
    ("fault", "controller"),
    [("worker", "gloo"), ("sshd", "gloo"), ("link", "gloo"), ("worker", "mpi"), ("link", "mpi")],
)
def test_a_fault_on_one_host_fails_the_job_naming_it_and_leaves_nothing(cluster, fault, controller):
    host = cluster.hosts[1]
    spec = JobSpec(code=ENDLESS_HOROVOD, workers=2, backend="horovod", controller=controller)
    job = api.submit(JobSpec(**{**spec.to_dict(), "grace": 2, **cluster.options()}))
    try:
        _running(job)
        if fault == "worker":
            # rank 1 runs on the second host (the hosts share this machine's pids)
            worker = psutil.Process(job.status().process(ProcessId("worker", 1)).pid)
            assert "jupyter_distrain.worker" in " ".join(worker.cmdline())
            worker.kill()
        elif fault == "sshd":
            host.kill_sshd()
        else:
            host.link(up=False)
        with pytest.raises(Exception) as failed:
            job.wait(60)
        status = job.status()
        assert status.state == "failed"
        text = f"{status.error} {status.error_tail}"
        if controller == "gloo":
            assert "jdh2" in text or host.address in text, text
        else:  # mpirun takes every rank down with it: the error names the first it listed
            assert re.search(r"rank \d on host jdh\d", status.error), text
        assert wait_until_gone(job.id, 30) == []
    finally:
        if fault == "sshd":
            host.start_sshd()
        elif fault == "link":
            host.link(up=True)
        job.stop()
    assert "failed" in str(failed.value)


@pytest.mark.horovod
def test_stop_leaves_nothing_on_any_host(cluster):
    job = api.submit(
        JobSpec(code=ENDLESS_HOROVOD, workers=2, backend="horovod", **cluster.options())
    )
    _running(job)
    remote = job_processes(job.id)
    assert len([p for p in remote if "jupyter_distrain.worker" in " ".join(p.cmdline())]) == 2
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 15) == []
    assert remote_dirs(job.id) == []


@pytest.mark.horovod
def test_a_memory_limit_and_a_scale_work_on_remote_workers(cluster, jobs_root):
    hog = (
        "import os, time\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    hog = bytearray(800 * 2**20)\n"
        "    hog[::4096] = b'x' * len(hog[::4096])\n"
        "time.sleep(60)\n"
    )
    job = api.submit(JobSpec(code=hog, workers=2, memory=0.5, backend="plain", **cluster.options()))
    with pytest.raises(Exception, match="worker 1 exceeded 0.5 GiB"):
        job.wait(60)
    assert wait_until_gone(job.id, 15) == []
    # a Keras job scaled from 2 to 3 workers resumes from the checkpoint its hosts wrote
    job = api.submit(
        JobSpec(
            code="EPOCHS, EPOCH_PAUSE = 6, 1.0\n" + KERAS_FIT,
            workers=2,
            grace=3,
            backend="horovod",
            **cluster.options(slots=2),
        )
    )
    log0 = job.dir.log_file(ProcessId("worker", 0))
    wait_for(lambda: log0.exists() and "epoch 1 size 2" in log0.read_text(), 120, what="epoch 1")
    job.scale(3)
    assert job.wait(timeout=300) == "succeeded"
    text = log0.read_text()
    before = [int(e) for e in re.findall(r"^epoch (\d+) size 2$", text, re.M)]
    after = [int(e) for e in re.findall(r"^epoch (\d+) size 3$", text, re.M)]
    assert after and after[0] == before[-1] + 1, text[-2000:]
    assert {p.host for p in job.status().processes} == {"jdh1", "jdh2"}


def _agent_wrapper(path: Path, program: str) -> str:
    """A ``--remote-python`` that runs ``program`` (Python) with the agent's arguments."""
    path.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} -c '{program}' \"$@\"\n")
    path.chmod(0o755)
    return str(path)


OTHER_PROTOCOL = """
import sys
import jupyter_distrain.launchers.agent.host as host
host.PROTOCOL, host.__version__ = 1, "0.0.9"
sys.exit(host.main(sys.argv[1:]))
"""

OLD_AGENT = """
import argparse, sys
parser = argparse.ArgumentParser(prog="python -m jupyter_distrain.launchers.agent")
command = parser.add_subparsers(dest="command", required=True).add_parser("preflight")
for option in ("--backend", "--ports"):  # as before --interface
    command.add_argument(option)
parser.parse_args(sys.argv[1:])
"""


def test_a_host_with_an_agent_of_another_version_is_refused_in_one_line(
    cluster, jobs_root, tmp_path
):
    other = _agent_wrapper(tmp_path / "other-python", OTHER_PROTOCOL)
    message = _refused(cluster, jobs_root, remote_python=other)
    assert (
        "host 10.232.0.11 runs jupyter_distrain 0.0.9 (agent protocol 1), this notebook "
        f"{jupyter_distrain.__version__} (protocol {PROTOCOL}): install the same version there"
    ) in message
    old = _agent_wrapper(tmp_path / "old-python", OLD_AGENT)
    message = _refused(cluster, jobs_root, remote_python=old)
    assert "host 10.232.0.12 runs an older jupyter_distrain (agent protocol 1)" in message
    assert "\n" not in message and "Traceback" not in message and "usage" not in message
    fault_row("a host of another version (agent protocol 1)", True, "refused", 0)


LOOP = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.2)\n"


def test_the_files_go_with_each_hosts_first_session_and_its_others_wait_for_them(
    cluster, jobs_root, tmp_path
):
    """No round trip of their own for the job's files: the first session of a job on a
    host carries them (the agent is run for ``preflight`` and ``run`` only, never
    ``unpack``), and that host's other sessions wait for them (each process ran the
    cell, so found train.py)."""
    calls = tmp_path / "calls"
    python = tmp_path / "python"  # --remote-python: says what it runs, then runs it
    python.write_text(f'#!/bin/sh\necho "$(hostname) $*" >> {calls}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hosts = f"{cluster.hosts[0].address}:2,{cluster.hosts[1].address}:1"
    options = {**cluster.options(), "hosts": hosts, "remote_python": str(python)}
    code = "import os\nprint('rank', os.environ['JUPYTER_DISTRAIN_RANK'], 'ran the cell')\n"
    job = api.submit(JobSpec(code=code, workers=3, backend="plain", **options))
    assert job.wait(120) == "succeeded", job.status().error
    for rank in range(3):
        assert f"rank {rank} ran the cell" in job.logs(ProcessId("worker", rank))
    agent = [line.split() for line in calls.read_text().splitlines() if AGENT_MODULE in line]
    commands = sorted((words[0], words[3]) for words in agent if words[3] != "send")
    assert commands == [
        ("jdh1", "preflight"),
        ("jdh1", "remove"),
        ("jdh1", "run"),
        ("jdh1", "run"),
        ("jdh2", "preflight"),
        ("jdh2", "remove"),
        ("jdh2", "run"),
    ]


def test_more_ranks_on_a_host_than_sshd_takes_sessions_on_one_connection_all_run(
    cluster, jobs_root
):
    """sshd takes at most 10 sessions on one connection (its default MaxSessions, which
    the test hosts keep): 16 ranks on each host, all up at once, go through more than one
    connection to it (the eleventh was refused: "Session open refused by peer"); the
    job's own connections end with it."""
    code = (
        "import os, time\n"
        "print('rank', os.environ['JUPYTER_DISTRAIN_RANK'], 'up', flush=True)\n"
        "time.sleep(3)\n"
    )
    job = api.submit(JobSpec(code=code, workers=32, backend="plain", **cluster.options(slots=16)))
    assert job.wait(300) == "succeeded", job.status().error
    for rank in range(32):
        assert f"rank {rank} up" in job.logs(ProcessId("worker", rank))
    assert wait_until_gone(job.id, 30) == []


def test_the_stacks_of_ddp_ranks_on_two_hosts_show_where_each_stands(cluster, jobs_root):
    spec = JobSpec(
        code=TORCH_STACKS_PROGRAM, workers=3, backend="torch", **cluster.options(slots=2)
    )
    job = api.submit(spec)
    report = check_torch_stacks(job, 3)
    assert {p.host for p in report.processes} == {"jdh1", "jdh2"}
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 30) == []


def test_a_rank_killed_on_a_host_restarts_the_job_on_the_hosts_when_a_restart_is_left(
    cluster, jobs_root
):
    spec = JobSpec(
        code=LOOP, workers=2, backend="torch", max_restarts=1, grace=1, **cluster.options()
    )
    job = api.submit(spec)
    said = restart_after_killing_rank_1(job, "step")
    assert said.startswith("restart 1 of 1 after rank 1 on host jdh"), said
    assert job.stop() == "stopped"
    assert wait_until_gone(job.id, 30) == []


def test_a_restart_resumes_from_the_periodic_checkpoint_across_two_hosts(cluster, jobs_root):
    """The DDP program of test_torch's periodic checkpoint test, one rank on each host:
    rank 1 dies at step 23, the job restarts and resumes from step 20 on both hosts."""
    spec = JobSpec(
        code=RESTARTING,
        workers=2,
        backend="torch",
        max_restarts=1,
        checkpoint_every="5",
        grace=2,
        **cluster.options(),
    )
    job = api.submit(spec)
    assert job.wait(180) == "succeeded", job.status().error
    log0 = job.logs(ProcessId("worker", 0))
    assert "jupyter_distrain: resumed from the checkpoint of step 20" in log0, log0
    assert log0.rstrip().endswith("ended at step 30"), log0
    assert wait_until_gone(job.id, 30) == []


def test_a_lost_host_is_left_out_under_min_workers_and_the_job_goes_on_with_the_other(
    cluster, jobs_root
):
    """Every process of the second host killed at once (sshd, agent, rank: the machine
    went down) under ``--max-restarts 1 --min-workers 1``: the job restarts on the first
    host alone, from the last periodic checkpoint, and succeeds; nothing is left."""
    job = api.submit(shrinking_spec(**cluster.options()))
    host = cluster.hosts[1]
    log1 = job.dir.log_file(ProcessId("worker", 1))
    try:
        wait_for(
            lambda: log1.exists() and "step 20" in log1.read_text() or job.done, 90, what="step 20"
        )
        assert not job.done, job.status().error
        kill_inside(host.name)
        assert job.wait(180) == "succeeded", job.status().error
    finally:
        host.kill_sshd()
        host.start_sshd()
    check_went_on_without(job, host.address)
    assert wait_until_gone(job.id, 30) == []


def test_what_a_killed_job_left_on_the_hosts_goes_at_the_next_contact(cluster, jobs_root):
    spec = JobSpec(code=LOOP, workers=2, backend="plain", **cluster.options())
    job = api.submit(spec)

    def stepping() -> bool:
        with contextlib.suppress(KeyError):  # no log yet
            return all("step" in job.logs(ProcessId("worker", i)) for i in (0, 1))
        return False

    wait_for(stepping, 60, what="both workers stepping")
    for proc in job_processes(job.id) + ssh_masters(kept=True):  # as a reboot: nothing ends
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert wait_until_gone(job.id, 30) == []
    (left,) = remote_dirs(job.id)
    hostnames = sorted(p.name for p in left.iterdir())
    assert len(hostnames) == 2 and (left / hostnames[0] / "push.pkl").parent.is_dir()
    stranger = Path.home() / REMOTE_ROOT / "another-notebooks-000000" / hostnames[0]
    stranger.mkdir(mode=0o700, parents=True)
    (stranger / "owner").write_text("another notebook")
    try:
        second = api.submit(
            JobSpec(code="print('second')", workers=2, backend="plain", **cluster.options())
        )
        assert second.wait(120) == "succeeded"
        assert "second" in second.logs(ProcessId("worker", 1))
        gone = remote_dirs(job.id) == []  # the killed job's directories, on both hosts
        kept = (stranger / "owner").read_text() == "another notebook"  # not this notebook's
        left = wait_until_gone(second.id, 15)
        fault_row(
            "supervisor, agents SIGKILLed: leftovers on hosts", gone and kept, "removed", len(left)
        )
        assert gone and kept and left == []
    finally:
        shutil.rmtree(stranger.parent, ignore_errors=True)


def test_a_rerun_takes_warm_processes_from_each_hosts_own_pool(
    cluster, jobs_root, monkeypatch, capsys
):
    """The pool on each host: started by the first job there (in the host's network
    namespace), filled beside it, so the re-run takes its ranks warm on
    both hosts and they still synchronise; ``%distributed pool`` lists the hosts' pools
    and ``--clear`` ends them, leaving only sshd on the hosts."""
    spec = JobSpec(code=DDP_PROGRAM, workers=2, backend="torch", **cluster.options())
    try:

        def ready() -> bool:
            pools = host_pools()
            return len(pools) == 2 and all(
                not isinstance(infos, str) and any(i.idle for i in infos)
                for infos in pools.values()
            )

        second = ddp_rerun_from_the_pool(spec, monkeypatch, ready)
        assert [p.host for p in second.status().processes] == ["jdh1", "jdh2"]
        capsys.readouterr()
        print_pools(False)
        listed = capsys.readouterr().out
        for host in cluster.hosts:  # as --hosts names them
            line = re.search(rf"on {host.address}: torch-\S+: torch for .*", listed)
            assert line and "1 idle" in line.group() and "MiB idle" in line.group(), listed
            keeper = int(re.search(r"keeper pid (\d+)", line.group()).group(1))
            assert keeper in namespace_pids(host.name)  # the host's own pool
    finally:
        print_pools(True)
    sshd = {h.sshd.pid for h in cluster.hosts}
    for host in cluster.hosts:
        assert wait_for(lambda h=host: set(namespace_pids(h.name)) <= sshd, 20, what="pools")


def test_an_ordinary_user_runs_a_job_on_the_hosts_with_her_own_key_and_known_hosts(cluster):
    """distrain-alice, from her own account: her key pair and known_hosts in her ~/.ssh
    (not the tests' root key), her ranks run as her on both hosts, and once it ends
    nothing of hers is left on either host."""
    home = Path(os.path.expanduser(f"~{ALICE}"))
    ssh = home / ".ssh"
    key = ssh / "id_distrain_test"
    run_as(ALICE, ["mkdir", "-p", "-m", "700", str(ssh)])
    if not key.exists():
        made = run_as(ALICE, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
        assert made.returncode == 0, made.stderr
    known = ssh / "known_hosts_distrain_test"
    for path, text in (
        (ssh / "authorized_keys", key.with_suffix(".pub").read_text()),
        (known, cluster.known_hosts.read_text()),
    ):
        path.write_text(text)
        shutil.chown(path, ALICE, ALICE)
        path.chmod(0o600)
    options = {**cluster.options(), "ssh_identity": str(key), "ssh_known_hosts": str(known)}
    outcome = submit_as(ALICE, code=WHOAMI, backend="plain", **options)
    assert outcome["state"] == "succeeded", outcome["error"]
    lines = sorted(line for log in outcome["logs"].values() for line in log.splitlines())
    assert lines == [f"user {ALICE} on jdh1", f"user {ALICE} on jdh2"], outcome["logs"]
    run_as(ALICE, [sys.executable, "-m", "jupyter_distrain.cli", "pool", "--clear"])
    uid = pwd.getpwnam(ALICE).pw_uid

    def hers() -> list[str]:
        found = []
        for host in cluster.hosts:
            for pid in namespace_pids(host.name):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if psutil.Process(pid).uids().real == uid:
                        found.append(f"{host.name}: {' '.join(psutil.Process(pid).cmdline())}")
        return found

    assert left_after(hers, 15) == []


def test_clearing_the_kept_connections_leaves_a_running_jobs_ranks_alone(
    cluster, jobs_root, capsys
):
    """``%distributed pool --clear`` while a job runs through the kept connections (this
    kernel's or another's): they take no new session, the next job opens its own, and
    the running job's ranks go on until it is stopped; then the old connections end."""
    from jupyter_distrain.launchers.ssh.kept import kept_masters

    print_pools(True)
    spec = JobSpec(code=LOOP, workers=2, backend="plain", **cluster.options())
    running = api.submit(spec)

    def steps() -> int:
        try:
            return running.logs(ProcessId("worker", 1)).count("step")
        except KeyError:  # no log yet
            return 0

    try:
        wait_for(lambda: steps() or running.done, 60, what="steps")
        masters = {m.host: m.pid for m in kept_masters()}
        assert len(masters) == 2, masters
        print_pools(True)
        assert "ends with that job" in capsys.readouterr().out
        assert kept_masters() == []  # no new session goes through them
        before = steps()
        time.sleep(2)
        assert not running.done and steps() > before + 3
        assert not any(ended(pid) for pid in masters.values())  # still carrying the job
        beside = api.submit(dataclasses.replace(spec, code="print('beside')"))
        assert beside.wait(60) == "succeeded", beside.status().error
        assert not set(masters.values()) & {m.pid for m in kept_masters()}
        assert not running.done
    finally:
        running.stop()
    assert wait_for(lambda: all(map(ended, masters.values())), 15, what="the old connections")
    print_pools(True)


def test_a_rerun_reuses_each_hosts_kept_connection_and_checks_nothing_again(
    cluster, jobs_root, monkeypatch, capsys
):
    """One ssh connection per host, kept between jobs: the re-run's pre-flight and
    sessions go through it (no new handshake, the host not checked again), it holds no
    job's forwards once the job is over, it is listed and closed by ``%distributed
    pool``, and with ``JUPYTER_DISTRAIN_SSH_KEEP`` it ends that long after its last use."""
    from jupyter_distrain.launchers.ssh.kept import kept_masters

    print_pools(True)
    spec = JobSpec(
        code=LOOP.replace("while True", "for _ in range(3)"),
        workers=2,
        backend="plain",
        **cluster.options(),
    )
    first = api.submit(spec)
    assert first.wait(60) == "succeeded"
    masters = {m.host: m.pid for m in kept_masters()}
    assert sorted(masters) == sorted(h.address for h in cluster.hosts)
    assert [ssh_connections(h) for h in cluster.hosts] == [1, 1]  # the kept ones
    assert [forwarded_sockets(h) for h in cluster.hosts] == [[], []]  # cancelled at the end
    records = {
        p: p.read_text()
        for p in Path(os.path.dirname(kept_masters()[0].options.control_path)).glob("*.json")
    }
    second = api.submit(spec)
    assert second.wait(60) == "succeeded"
    assert {m.host: m.pid for m in kept_masters()} == masters  # the same connections
    assert [ssh_connections(h) for h in cluster.hosts] == [1, 1]
    assert {p: p.read_text() for p in records} == records  # nothing checked again
    assert [forwarded_sockets(h) for h in cluster.hosts] == [[], []]
    # a master killed (its socket left behind): the next job keeps a new one, no lone one
    psutil.Process(masters[cluster.hosts[0].address]).kill()
    wait_for(lambda: ssh_connections(cluster.hosts[0]) == 0, 10, what="the connection dropped")
    assert api.submit(spec).wait(60) == "succeeded"
    masters = {m.host: m.pid for m in kept_masters()}
    assert len(masters) == 2 and len(ssh_masters(kept=True)) == 2
    assert [ssh_connections(h) for h in cluster.hosts] == [1, 1]
    capsys.readouterr()
    print_pools(False)
    listed = capsys.readouterr().out
    for host in cluster.hosts:
        assert f"ssh connection kept to {host.address}: pid {masters[host.address]}" in listed
    print_pools(True)
    assert kept_masters() == []
    assert (
        left_after(lambda: [p for p in ssh_masters(kept=True) if p.pid in masters.values()], 5)
        == []
    )
    assert wait_for(
        lambda: [ssh_connections(h) for h in cluster.hosts] == [0, 0], 10, what="connections closed"
    )
    monkeypatch.setenv("JUPYTER_DISTRAIN_SSH_KEEP", "2")
    third = api.submit(spec)
    assert third.wait(60) == "succeeded"
    pids = [m.pid for m in kept_masters()]  # kept after the job; asking is a use: once
    assert len(pids) == 2
    wait_for(lambda: all(map(ended, pids)), 15, what="the kept ones to end")
    assert [ssh_connections(h) for h in cluster.hosts] == [0, 0]
