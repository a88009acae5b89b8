"""The warm worker pool, with real keepers and pooled processes (TensorFlow or torch
imported for real): a re-run takes them, they behave like fresh workers, each runs one job, stop and
a lost supervisor take them down, an unused pool ends, ``--no-pool`` starts cold."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import STACKS_PROGRAM, check_stacks_of_the_odd_rank, fault_row

from jupyter_distrain import JobFailed, JobSpec, processes, submit
from jupyter_distrain.client import standby
from jupyter_distrain.client.commands import print_pools
from jupyter_distrain.client.follow import follow
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.launchers.local import LocalLauncher
from jupyter_distrain.pool import client, kinds, priority, wire
from jupyter_distrain.timing import poll_until

PROBE = """\
import json, os, sys
import tensorflow
report = {
    "env_names": sorted(os.environ),
    "pid": os.getpid(),
    "cwd": os.getcwd(),
    "netns": os.stat("/proc/self/ns/net").st_ino,
    "x": os.environ.get("X"),
    "main": sys.modules["__main__"].__file__,
    "argv0": sys.argv[0],
    "keeper_loaded": "jupyter_distrain.pool.keeper" in sys.modules,
    "policy": os.sched_getscheduler(0),
    "ppid": os.getppid(),
    "sid": os.getsid(0),
    "draws": [__import__("numpy").random.random(), __import__("random").random()],
    "frozen": __import__("gc").get_freeze_count(),
    "autogroup": open("/proc/self/autogroup").read() if os.path.exists("/proc/self/autogroup") else "",
    "intra_op": os.environ.get("TF_NUM_INTRAOP_THREADS"),
    "userns": os.stat("/proc/self/ns/user").st_ino,
    "capabilities": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")],
}
if "tensorflow" in sys.modules:  # the threads TensorFlow's runtime starts at its first op
    before = len(os.listdir("/proc/self/task"))
    tensorflow.matmul(tensorflow.ones((8, 8)), tensorflow.ones((8, 8)))
    report["runtime_threads"] = len(os.listdir("/proc/self/task")) - before
print("REPORT " + json.dumps(report), flush=True)
"""
# the pool's own rules (claims, stop, lost keepers, idle ends, stale code) hold for any
# kind: they are tested on torch's, which imports in about a third of TensorFlow's time
LIGHT = "torch"
LIGHT_PROBE = PROBE.replace("import tensorflow", "import torch")


@pytest.fixture
def pool_on(monkeypatch, jobs_root):
    """Pools on (the test suite runs with them off), ended at teardown: nothing left."""
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "1")
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL_IDLE", "60")
    yield jobs_root
    standby.discard()
    keepers = [psutil.Process(info.keeper) for info in client.list_pools(jobs_root)]
    client.drain(jobs_root)
    gone, alive = psutil.wait_procs(keepers, timeout=15)
    assert alive == []


def _report(job, index: int = 0) -> dict:
    line = next(x for x in job.logs(ProcessId("worker", index)).splitlines() if "REPORT " in x)
    return json.loads(line.split("REPORT ", 1)[1])


def _ready_pool(count: int = 2) -> client.PoolInfo:
    def ready() -> client.PoolInfo | None:
        pools = client.list_pools()
        if pools and len(pools[0].idle) >= count and not pools[0].starting:
            return pools[0]
        return None

    info = poll_until(ready, 120, 0.2)
    assert info is not None, client.list_pools()
    return info


def _run(code: str, backend: str = "tf", **fields) -> object:
    job = submit(JobSpec(code=code, workers=2, backend=backend, **fields))
    assert job.wait(timeout=180) == "succeeded", job.logs()
    return job


def test_a_rerun_takes_pooled_processes_that_behave_like_fresh_workers(pool_on, tmp_path):
    first = _run(PROBE, env={"X": "first"})
    assert [p.pooled for p in first.status().processes] == [False, False]
    idle = _ready_pool().idle

    second = _run(PROBE, env={"X": "second"}, workdir=str(tmp_path))
    rows = second.status().processes
    assert [p.pooled for p in rows] == [True, True]
    assert sorted(p.pid for p in rows) == sorted(idle)
    for index in range(2):
        report = _report(second, index)
        assert report["x"] == "second"  # a per-job --env value, given at claim time
        assert report["cwd"] == str(tmp_path)
        assert report["main"].endswith("jupyter_distrain/worker/__main__.py")
        assert report["argv0"] == str(second.dir.train_file)
        assert not report["keeper_loaded"]
        # the same names as a fresh worker's, including what importing TensorFlow set
        assert report["env_names"] == _report(first, index)["env_names"]
        assert "TF2_BEHAVIOR" in report["env_names"]
        # the job's private network namespace, not the keeper's (the host's)
        assert report["netns"] != os.stat("/proc/self/ns/net").st_ino
        # what the pre-import made is frozen: the job's full collections do not scan it
        assert _report(first, index)["frozen"] == 0
        assert report["frozen"] > 100_000
        # its share of the cores (2 processes here), taken by TensorFlow's runtime as in
        # a cold process: imported before the job, it starts its thread pools at the job's
        # first op
        assert report["intra_op"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
        assert report["runtime_threads"] == _report(first, index)["runtime_threads"]
        # no capability in the job's namespaces, as a cold worker after its exec
        assert report["capabilities"] == _report(first, index)["capabilities"]
        assert report["capabilities"][:3] == ["0" * 16] * 3  # inheritable, permitted, effective
    assert _report(second, 0)["netns"] == _report(second, 1)["netns"]
    # in the user namespace that owns the job's network (an ordinary account's job makes
    # one; as root the job keeps this one). Compared within the job: two jobs' namespaces
    # may carry the same number, the first's freed before the second's was made
    userns = {_report(second, i)["userns"] for i in range(2)}
    assert len(userns) == 1
    assert (userns == {os.stat("/proc/self/ns/user").st_ino}) == (os.geteuid() == 0), userns
    # each ran one job and is gone; the pool refilled with new processes
    assert not any(psutil.pid_exists(pid) for pid in idle)
    assert not set(_ready_pool().idle) & set(idle)


def _lowered(pid: int) -> bool:
    """Whether ``pid`` runs lowered: its autogroup at nice 19 where the kernel has
    autogroups, and SCHED_IDLE exactly where this account may undo it (root; an ordinary
    account is lowered by its autogroup alone)."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    nice = autogroup.read_text().split()[-1] if autogroup.exists() else "19"
    idle = os.sched_getscheduler(pid) == os.SCHED_IDLE
    return nice == "19" and idle == priority.may_use_idle_policy()


def test_the_pool_imports_once_and_forks_one_run_ahead_so_reruns_straight_after_are_warm(
    pool_on, monkeypatch
):
    held = LIGHT_PROBE + "import time\ntime.sleep(2)\n"
    first = submit(JobSpec(code=held, workers=2, backend=LIGHT))
    # the first job runs cold, and has the pool import beside it: its zygote, lowered
    assert poll_until(lambda: first.status().state == "running", 60)
    zygote = poll_until(lambda: client.list_pools() and client.list_pools()[0].zygote, 30)
    assert zygote and _lowered(zygote)
    assert first.wait(timeout=120) == "succeeded"
    assert poll_until(lambda: not _lowered(zygote), 10)  # no job runs: imports at full speed

    second = submit(JobSpec(code=held, workers=2, backend=LIGHT))  # straight after
    assert poll_until(lambda: second.status().state == "running", 60)
    # its claims had the zygote fork the next run's processes at once (read once the
    # listing no longer shows one the job took as idle)
    claimed = {p.pid for p in second.status().processes}

    def forked_ahead() -> list[int] | None:
        idle = client.list_pools()[0].idle
        return idle if len(idle) == 2 and not claimed & set(idle) else None

    ahead = poll_until(forked_ahead, 30)
    assert second.wait(timeout=120) == "succeeded"
    # the kernel gained a variable no library reads at import (Accelerate's
    # notebook_launcher leaves this one): the pool serves it all the same, without a word
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT")
    third = _run(held, LIGHT)  # straight after
    assert sorted(p.pid for p in third.status().processes) == sorted(ahead)
    assert third.status().warnings == []
    keeper = client.list_pools()[0].keeper
    for job in (second, third):
        rows = job.status().processes
        assert [p.pooled for p in rows] == [True, True]
        reports = [_report(job, index) for index in range(2)]
        for row, report in zip(rows, reports, strict=True):
            assert report["ppid"] == keeper and report["sid"] == row.pid  # forked, detached
            assert report["policy"] == os.SCHED_OTHER
            assert report["autogroup"].split()[-1:] in ([], ["0"])
        # forked from one zygote, yet numpy's (and Python's) generators differ
        assert reports[0]["draws"][0] != reports[1]["draws"][0]
        assert reports[0]["draws"][1] != reports[1]["draws"][1]
    # one torch reads as it is imported: a cold start, and the cell says why, once
    fourth = _run(held, LIGHT, env={"TORCH_SHOW_CPP_STACKTRACES": "1"})
    assert [p.pooled for p in fourth.status().processes] == [False, False]
    assert fourth.status().warnings == [
        "started cold: the pool's processes were imported with another "
        "TORCH_SHOW_CPP_STACKTRACES (the pool now imports with this job's)"
    ]


SCALABLE = """\
import os, sys, time
import torch
import jupyter_distrain
print("up", flush=True)
while not jupyter_distrain.should_checkpoint():
    time.sleep(0.05)
sys.exit(jupyter_distrain.CHECKPOINT_EXIT)
"""


def test_the_stacks_of_pooled_ranks_show_where_each_stands(pool_on):
    first = submit(JobSpec(code="import torch\n", workers=3, backend=LIGHT))
    assert first.wait(timeout=180) == "succeeded", first.logs()
    _ready_pool(3)
    job = submit(JobSpec(code="import torch\n" + STACKS_PROGRAM, workers=3, backend=LIGHT))
    check_stacks_of_the_odd_rank(job, 3, lines_before=1)
    assert [p.pooled for p in job.status().processes] == [True] * 3
    assert job.stop() == "stopped"


def test_a_scale_by_restart_takes_every_new_rank_from_the_pool(pool_on):
    _run(LIGHT_PROBE, LIGHT)
    _ready_pool()
    job = submit(JobSpec(code=SCALABLE, workers=2, backend=LIGHT, grace=2))
    assert poll_until(lambda: job.status().state == "running", 60)
    assert [p.pooled for p in job.status().processes] == [True, True]
    job.scale(3)
    restarted = lambda: job.status().generation == 1 and job.status().state == "running"  # noqa: E731
    assert poll_until(restarted, 60)
    # the third was asked of the pool with the scale, while the two checkpointed
    assert [p.pooled for p in job.status().processes] == [True, True, True]
    assert job.stop() == "stopped"


def test_no_pool_starts_cold_and_leaves_the_pool_alone(pool_on):
    _run(LIGHT_PROBE, LIGHT)
    idle = _ready_pool().idle
    job = _run(LIGHT_PROBE, LIGHT, pool=False)
    assert [p.pooled for p in job.status().processes] == [False, False]
    assert all(psutil.pid_exists(pid) for pid in idle)


def test_stopping_a_job_and_losing_its_supervisor_leave_no_pooled_process(pool_on):
    _run(LIGHT_PROBE, LIGHT)
    _ready_pool()
    sleeper = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
    job = submit(JobSpec(code=sleeper, workers=2, backend=LIGHT))
    assert poll_until(lambda: job.status().state == "running", 60)
    pids = [p.pid for p in job.status().processes]
    assert [p.pooled for p in job.status().processes] == [True, True]
    job.stop()
    assert not any(psutil.pid_exists(pid) for pid in pids)

    # the pool refills when that job ends; the next job's supervisor is SIGKILLed
    _ready_pool()
    job = submit(JobSpec(code=sleeper, workers=2, backend=LIGHT))
    assert poll_until(lambda: job.status().state == "running", 60)
    # taken before the kill: a rank may be gone before a Process could be made after it
    ranks = [psutil.Process(p.pid) for p in job.status().processes]
    _supervisor_of(job).send_signal(signal.SIGKILL)
    gone, alive = psutil.wait_procs(ranks, timeout=15)
    assert alive == []
    assert poll_until(lambda: job.status().state == "failed", 15)


GATED = """\
import os, sys, time
gate = {gate!r}
print("up", flush=True)
while not os.path.exists(gate):
    time.sleep(0.1)
sys.exit(3 if os.environ["JUPYTER_DISTRAIN_INDEX"] == "1" else 0)
"""


def _pooled_job_with_its_keeper_killed(gate: str):
    """A running job of 2 pooled processes whose pool keeper was then SIGKILLed."""
    _run(LIGHT_PROBE, LIGHT)
    keeper = psutil.Process(_ready_pool().keeper)
    job = submit(JobSpec(code=GATED.format(gate=gate), workers=2, backend=LIGHT))
    assert poll_until(lambda: job.status().state == "running", 60)
    assert [p.pooled for p in job.status().processes] == [True, True]
    keeper.kill()
    keeper.wait(10)
    return job


def test_a_pooled_rank_failing_after_its_keeper_is_killed_fails_the_job(pool_on, tmp_path):
    gate = tmp_path / "gate"
    job = _pooled_job_with_its_keeper_killed(str(gate))
    gate.touch()
    with pytest.raises(JobFailed, match="exit code 3"):
        job.wait(timeout=60)
    codes = {str(p.id): p.exit_code for p in job.status().processes}
    fault_row("pool keeper killed, then a rank exits 3", codes["worker-1"] == 3, job.state, 0)
    assert codes["worker-1"] == 3, codes  # its own code (its bye), not the lost keeper's


def test_losing_the_keeper_then_the_supervisor_leaves_no_process_of_the_job(pool_on, tmp_path):
    job = _pooled_job_with_its_keeper_killed(str(tmp_path / "never"))
    procs = [psutil.Process(p.pid) for p in job.status().processes]
    _supervisor_of(job).kill()
    gone, alive = psutil.wait_procs(procs, timeout=15)
    failed = poll_until(lambda: job.status().state == "failed", 15)
    fault_row("pool keeper killed, then the supervisor", not alive, job.state, len(alive))
    assert alive == []
    assert failed


def _supervisor_of(job) -> psutil.Process:
    """The supervisor (the warden's child), as its control file names it."""
    return psutil.Process(job.dir.read_control().pid)


SEEN = (
    "import os; print('SEEN', os.environ.get('STANDBY_MARK'), flush=True); "
    "print('NATIVE', os.environ.get('NATIVE_MARK'), flush=True)"
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _standbys_of_this_process() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # a zombie another test left unreaped
            if "jupyter_distrain.supervisor.standby" in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_a_job_after_a_followed_one_is_supervised_by_the_standby_with_the_kernels_environment(
    pool_on, monkeypatch, capsys
):
    follow(submit(JobSpec(code=SEEN, workers=2, backend="plain")))
    ready = standby.standby_pid()
    assert ready is not None
    monkeypatch.setenv("STANDBY_MARK", "set after the standby started")
    # set by native code (as pytest sets COLUMNS): a cold start's child inherits it, and
    # so must the standby; os.environ does not show it
    libc = ctypes.CDLL(None)
    libc.setenv(b"NATIVE_MARK", b"set by native code", 1)
    assert "NATIVE_MARK" not in os.environ
    try:
        _supervised_by_the_standby(ready, monkeypatch)
    finally:
        libc.unsetenv(b"NATIVE_MARK")


def _supervised_by_the_standby(ready: int, monkeypatch) -> None:
    cold = submit(JobSpec(code=SEEN, workers=2, backend="plain", pool=False))
    assert cold.wait(timeout=60) == "succeeded", cold.logs()
    assert cold.dir.read_control().warden_pid != ready  # --no-pool: all of it cold
    assert standby.standby_pid() == ready

    job = submit(JobSpec(code=SEEN, workers=2, backend="plain"))
    assert job.wait(timeout=60) == "succeeded", job.logs()
    assert job.dir.read_control().warden_pid == ready
    assert job.logs().count("SEEN set after the standby started") == 2
    assert job.logs().count("NATIVE set by native code") == 2
    assert standby.standby_pid() not in (None, ready)  # used once; the job started another
    assert poll_until(lambda: _gone(ready), 15)

    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "0")
    follow(submit(JobSpec(code=SEEN, workers=2, backend="plain")))
    assert standby.standby_pid() is None
    assert _standbys_of_this_process() == []


def _worker_pids(job) -> list[int]:
    def started() -> list[int] | None:
        pids = [p.pid for p in job.status().processes if p.pid]
        return pids if len(pids) == 2 else None

    pids = poll_until(started, 30)
    assert pids is not None, job.status()
    return pids


def _warden(job) -> int:
    control = poll_until(job.dir.read_control, 30)
    assert control is not None
    return control.warden_pid


def test_a_submitted_job_starts_the_next_ones_standby_lowered_until_it_is_followed_or_used(
    pool_on,
):
    """The standby is started with the job, importing on the CPU time it leaves, and is
    put back to normal when the job's follow ends, or when it is handed a job at once."""
    assert priority.can_lower()  # an autogroup here; as root, SCHED_IDLE too
    wait = "import time; time.sleep(3); " + SEEN
    first = submit(JobSpec(code=wait, workers=2, backend="plain"))
    ready = standby.standby_pid()
    assert ready is not None
    assert _lowered(ready)
    follow(first, stream=False)
    assert standby.standby_pid() == ready and not _lowered(ready)

    second = submit(JobSpec(code=wait, workers=2, backend="plain"))
    assert _warden(second) == ready
    lowered_next = standby.standby_pid()
    assert lowered_next not in (None, ready) and _lowered(lowered_next)
    third = submit(JobSpec(code=wait, workers=2, backend="plain"))  # straight after
    assert _warden(third) == lowered_next
    assert not _lowered(lowered_next)
    assert not any(_lowered(pid) for pid in _worker_pids(third))
    for job in (second, third):
        assert job.wait(timeout=60) == "succeeded", job.logs()


def test_a_standby_ends_with_the_process_that_started_it(pool_on):
    code = "from jupyter_distrain.client import standby; standby.prepare(); print(standby.standby_pid())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pid = int(out.stdout)
    assert poll_until(lambda: _gone(pid), 15), psutil.Process(pid).cmdline()


def test_an_unused_pool_ends_and_the_listing_shows_it(pool_on, monkeypatch, capsys):
    # the idle limit outlasts the first (cold) job and the refill after it, each importing
    # torch: ~2 s on 2 free cores, 6-8 s on 2 cores that other jobs share
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL_IDLE", "15")
    _run(LIGHT_PROBE, LIGHT)
    info = _ready_pool()
    print_pools(clear=False)
    out = capsys.readouterr().out
    assert f"keeper pid {info.keeper}; 2 idle" in out and " MiB idle" in out
    assert info.memory_bytes > 50 * 2**20  # torch is imported in them
    procs = [psutil.Process(pid) for pid in [info.keeper, *info.idle]]
    gone, alive = psutil.wait_procs(procs, timeout=40)
    assert alive == []
    assert client.list_pools() == []


KERAS_HOROVOD = """\
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from tensorflow.python.autograph.impl import api
hvd.init()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=4, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
codes = [c for c in api._TRANSPILER._cache._cache if hasattr(c, "co_filename")]
converted = sorted({c.co_name for c in codes if "/horovod/" in c.co_filename})
print("SIZE", hvd.size(), hvd.rank(), "CONVERTED", converted, flush=True)
"""


@pytest.mark.horovod
def test_horovod_is_initialised_for_the_job_in_pooled_processes(pool_on):
    first = submit(JobSpec(code=KERAS_HOROVOD, workers=2, backend="horovod"))
    assert first.wait(timeout=180) == "succeeded", first.logs()
    _ready_pool()
    job = submit(JobSpec(code=KERAS_HOROVOD, workers=2, backend="horovod"))
    assert job.wait(timeout=180) == "succeeded", job.logs()
    assert [p.pooled for p in job.status().processes] == [True, True]
    # a pooled process imported Horovod before the job's bootstrap could patch it: its
    # tf.functions (allreduce_grads, broadcast_group) are still traced unconverted
    for rank in (0, 1):
        assert f"SIZE 2 {rank} CONVERTED []" in job.logs(ProcessId("worker", rank))


@contextlib.contextmanager
def _keeper(directory: Path, **settings: str):
    """A keeper of a tensorflow pool in ``directory`` (made if need be), started as the
    notebook starts one, with these pool settings in its environment; ended after."""
    directory.mkdir(mode=0o700, exist_ok=True)
    keeper = subprocess.Popen(
        [sys.executable, "-m", "jupyter_distrain.pool.keeper", str(directory), "tensorflow"],
        env={**os.environ, **settings},
    )
    try:
        socket_path = str(wire.keeper_socket(directory))
        assert poll_until(lambda: os.path.exists(socket_path), 30)
        yield keeper, socket_path
    finally:
        keeper.terminate()
        keeper.wait(15)


def _state(directory: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((directory / "state.json").read_text())
    return {}


def _want(socket_path: str, count: int) -> None:
    """Ask for ``count`` idle processes imported with this process's environment."""
    env = dict(os.environ)
    assert client._ask(socket_path, {"op": "want", "count": count, "env": env}) == {"ok": True}


def test_a_keeper_that_cannot_write_its_state_keeps_serving(jobs_root):
    directory = client.pools_dir(jobs_root, create=True) / "tensorflow-unwritable"
    directory.mkdir(mode=0o700)
    (directory / "state.json").mkdir()  # every write of the state fails, as on a full disk
    with _keeper(directory) as (keeper, socket_path):
        want = {"op": "want", "count": 0, "env": {}}
        assert client._ask(socket_path, want) == {"ok": True}
        time.sleep(1)  # a turn of the loop, which writes the state
        assert keeper.poll() is None
        assert client._ask(socket_path, want) == {"ok": True}
        assert "state.json" in (directory / "keeper.log").read_text()  # said why, once a turn


def test_a_hosts_drained_pools_are_those_that_answered_as_they_were(jobs_root, tmp_path):
    """``pools --drain`` on a host answers the pools it asked: a keeper that does not
    answer is not counted, and one that ends as soon as it is drained (no job holds its
    processes) still is (the listing after the drain missed it: the last CI's
    ``asked 0 pool(s)`` on one Ray node)."""
    from jupyter_distrain.launchers.agent import pooled

    base = pooled.host_pools(tmp_path, create=True)
    with _keeper(base / "tensorflow-drained") as (keeper, _):
        assert poll_until(lambda: client.list_pools(base=base), 30)
        assert [p["keeper"] for p in pooled.pools(drain=True, root=tmp_path)] == [keeper.pid]
        assert keeper.wait(15) is not None
    with _keeper(base / "tensorflow-stopped") as (keeper, _):
        assert poll_until(lambda: client.list_pools(base=base), 30)
        keeper.send_signal(signal.SIGSTOP)
        try:
            assert pooled.pools(drain=True, root=tmp_path) == []
        finally:
            keeper.send_signal(signal.SIGCONT)


def test_the_memory_bound_counts_the_zygote_and_what_each_forked_process_holds_alone(
    jobs_root,
):
    # 1 GiB: TensorFlow's zygote (~400 MiB) and the four wanted, forked from it, each
    # holding alone only what it wrote since (a few MiB)
    directory = client.pools_dir(jobs_root, create=True) / "tensorflow-memory"
    with _keeper(directory, JUPYTER_DISTRAIN_POOL_MEMORY="1") as (keeper, socket_path):
        _want(socket_path, 4)
        four = lambda: [r for r in _state(directory).get("idle", []) if r["ready"]][3:]  # noqa: E731
        assert poll_until(four, 120, 0.1), _state(directory)
        state = _state(directory)
        zygote = psutil.Process(state["zygote"]["pid"]).memory_info().rss
        alone = [processes.private_bytes(row["pid"]) for row in state["idle"]]
        assert zygote > 200 * 2**20 and 0 < max(alone) < 64 * 2**20, (zygote, alone)
        assert zygote + sum(alone) < 2**30
    # 0.3 GiB: not even the zygote (512 MiB estimated before one was measured)
    directory = client.pools_dir(jobs_root, create=True) / "tensorflow-small"
    with _keeper(directory, JUPYTER_DISTRAIN_POOL_MEMORY="0.3") as (keeper, socket_path):
        _want(socket_path, 4)
        time.sleep(2)
        assert not _state(directory)["zygote"] and not _state(directory)["idle"]


def test_a_claim_that_cannot_enter_the_jobs_namespace_turns_the_pool_off(jobs_root):
    # the pool for this kind and interpreter, as ensure() would find it
    directory = client.pools_dir(jobs_root, create=True) / kinds.pool_name("tensorflow")
    with _keeper(directory) as (keeper, socket_path):
        _want(socket_path, 1)
        assert poll_until(lambda: [r for r in _state(directory).get("idle", []) if r["ready"]], 120)
        pooled = _state(directory)["idle"][0]["pid"]
        request = {
            "op": "claim",
            "argv": [sys.executable, "-m", "jupyter_distrain.worker"],
            "env": dict(os.environ),
            "log": str(jobs_root / "claim.log"),
            "cwd": str(jobs_root),
        }
        # a namespace it cannot join
        not_a_network = os.open("/proc/self/ns/uts", os.O_RDONLY)
        users = os.open("/proc/self/ns/user", os.O_RDONLY)
        with wire.connect(socket_path, 15) as connection:
            wire.send(connection, request, [not_a_network, users])
            answer, _ = wire.receive(connection)
        os.close(not_a_network)
        os.close(users)
        assert "cannot join the job's network namespace" in answer["empty"]
        # not kept for the next claim to fail the same way: off, once, and the keeper ends
        assert keeper.wait(30) == 0
        assert not psutil.pid_exists(pooled)
        assert "network namespace" in (directory / "off").read_text()
        assert (directory / "keeper.log").read_text().count("the pool is off") == 1
    assert client.ensure("tensorflow", dict(os.environ)) is None
    spec = JobSpec(code="pass", workers=2, backend="tf")
    assert LocalLauncher.kind.choose_pool(spec, {"JUPYTER_DISTRAIN_POOL": "1"}).pool_socket == ""


@pytest.mark.root  # edits the installed package, as only its owner (an admin) can
def test_a_pool_that_ran_other_code_is_not_used_and_is_drained(pool_on):
    _run(LIGHT_PROBE, LIGHT)
    stale = _ready_pool()
    # an edit of this package (an upgrade of TensorFlow changes the pool's name the same way)
    edited = Path(kinds.__file__)
    before = edited.stat()
    newest = max(p.stat().st_mtime_ns for p in edited.parent.parent.rglob("*.py"))
    os.utime(edited, ns=(before.st_atime_ns, newest + 10**9))
    try:
        assert kinds.pool_name(LIGHT) != stale.name
        job = _run(LIGHT_PROBE, LIGHT)
    finally:
        os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert [p.pooled for p in job.status().processes] == [False, False]
    assert poll_until(lambda: not any(psutil.pid_exists(pid) for pid in stale.idle), 15)


def test_a_kind_whose_imports_leave_a_thread_running_is_not_pooled(jobs_root, tmp_path):
    # a thread that no setns can move: started at interpreter start-up, as an import might
    (tmp_path / "sitecustomize.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    directory = client.pools_dir(jobs_root, create=True) / "tensorflow-threads"
    with _keeper(directory) as (keeper, socket_path):
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        want = {"op": "want", "count": 2, "env": env}
        assert client._ask(socket_path, want) == {"ok": True}
        assert keeper.wait(120) == 0  # off, and the keeper ends
    assert "leaves threads running" in (directory / "off").read_text()
    assert (directory / "keeper.log").read_text().count("the pool is off") == 1
    left = [p.pid for p in psutil.process_iter(["cwd"]) if p.info["cwd"] == str(directory)]
    assert left == []  # its processes (started in the pool directory) are gone


THREADS = """\
import json, os
import numpy
numpy.ones((600, 600)) @ numpy.ones((600, 600))  # OpenBLAS runs its threads
tasks = {}
for tid in os.listdir("/proc/self/task"):
    net = os.readlink(f"/proc/self/task/{tid}/ns/net")
    tasks[tid] = [net, sorted(os.sched_getaffinity(int(tid)))]
print("TASKS " + json.dumps({"main": tasks[str(os.getpid())], "all": tasks}), flush=True)
"""


def test_every_thread_of_a_pooled_rank_is_in_the_jobs_namespace_and_cpus(pool_on):
    # OpenBLAS starts a thread pool when numpy (and scipy) load, during the pre-import
    fields = {"cpu": 1.0, "env": {"OPENBLAS_NUM_THREADS": "2"}}
    _run(THREADS, **fields)
    _ready_pool()
    job = _run(THREADS, **fields)
    assert [p.pooled for p in job.status().processes] == [True, True]
    for index in range(2):
        line = next(x for x in job.logs(ProcessId("worker", index)).splitlines() if "TASKS " in x)
        tasks = json.loads(line.split("TASKS ", 1)[1])
        assert len(tasks["all"]) > 1  # BLAS threads, started again from the job's thread
        for tid, (net, cpus) in tasks["all"].items():
            assert [net, cpus] == tasks["main"], (tid, tasks)


def test_the_pools_key_is_what_libraries_read_at_import_and_nothing_set_per_job():
    kernel = {"PATH": "/bin", "HOME": "/home/a", "TF_CPP_MIN_LOG_LEVEL": "2", "X": "1"}
    kernel |= {"HOROVOD_RANK": "0", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM"}
    assert kinds.import_env(kernel) == {"HOME": "/home/a", "TF_CPP_MIN_LOG_LEVEL": "2"}
    later = kernel | {"PATH": "/usr/bin", "X": "2", "TORCHELASTIC_SIGNALS_TO_HANDLE": ""}
    assert kinds.import_differences(kernel, later) == []  # given at claim time instead
    assert kinds.import_differences(kernel, kernel | {"OMP_NUM_THREADS": "1"}) == [
        "OMP_NUM_THREADS"
    ]
    assert kinds.import_differences(kernel, kernel | {"CUDA_VISIBLE_DEVICES": "1"}) == []
    assert "HOROVOD_RANK" not in kinds.without_per_job(kernel)  # what the zygote imports with
    assert kinds.without_per_job(kernel)["PATH"] == "/bin"
    assert not kinds.enabled({"JUPYTER_DISTRAIN_POOL": "0"})
    assert kinds.enabled({})


def test_a_keeper_started_where_a_killed_one_left_its_socket_answers_at_once(jobs_root):
    """ensure() (as a host's agent calls it, detached) returns once the new keeper
    listens, not as soon as a socket file exists: a killed keeper leaves its socket
    behind, and the first claim, made at once, must reach the new keeper (it plans
    the next run's processes; refused, the pool stayed empty until the next job)."""
    import socket

    base = jobs_root / "host-pools"
    base.mkdir(mode=0o700)
    directory = base / client.pool_name("torch")
    directory.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as dead:
        dead.bind(str(wire.keeper_socket(directory)))  # closed without unlinking
    try:
        path = client.ensure("torch", dict(os.environ), base=base, detach=True)
        wire.connect(path, 1).close()  # refused before: ensure returned at once
    finally:
        client.drain(base=base)
    assert poll_until(lambda: client.list_pools(base=base) == [], 20)
