"""The supervisor's transitions, driven by events through an in-memory launcher.

No process is started: the launcher below hands out fake processes whose exits
the tests decide, as Horovod tests its elastic driver with a fake discovery.
Everything else (the loop, the table, the backends' plans and rules, the job
directory) is the real code. The whole file runs in about a second.
"""

from __future__ import annotations

import base64
import itertools
import json
import signal
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from jupyter_distrain.backends.base import Services, WorkerCommand
from jupyter_distrain.client.widget import gpu_text
from jupyter_distrain.contract import session as cells
from jupyter_distrain.contract.keys import PROOF, prove
from jupyter_distrain.contract.launch import GpuUsage, LaunchedProcess, ProcessSpec, Slot
from jupyter_distrain.contract.process import CHECKPOINT_EXIT, Env, ProcessId, bye, hello
from jupyter_distrain.contract.spec import JobSpec
from jupyter_distrain.contract.stacks import (
    ANSWER_SECONDS,
    STACKS_SIGNAL,
    Frame,
    ProcessStacks,
    ThreadStack,
)
from jupyter_distrain.contract.store import JobDir
from jupyter_distrain.launchers.base import Launcher, LauncherKind
from jupyter_distrain.plugins import LAUNCHERS, load_plugin
from jupyter_distrain.supervisor import events as ev
from jupyter_distrain.supervisor import session
from jupyter_distrain.supervisor.core import Supervisor
from jupyter_distrain.timing import Deadline

W0, W1, W2 = (ProcessId("worker", i) for i in range(3))
_pids = itertools.count(10_000)


class FakeProcess(LaunchedProcess):
    """A process whose exit the test decides; SIGTERM and SIGKILL end it."""

    def __init__(self, proc: ProcessSpec | None, ignores_term: bool = False):
        self.proc = proc
        self.pid = next(_pids)
        self.signals: list[int] = []
        self.memory = 0
        self.gpu: GpuUsage | None = None
        self.ignores_term = ignores_term
        self.code: int | None = None
        self.lost = False  # ended with its host out of reach
        self.host = proc.slot.host if proc and proc.slot else "localhost"
        self._ended = threading.Event()

    def host_lost(self) -> bool:
        return self.lost

    def exit(self, code: int) -> None:
        if self.code is None:
            self.code = code
        self._ended.set()  # its waiter wakes (also for one that died unheard)

    def wait(self) -> int:
        self._ended.wait()
        assert self.code is not None
        return self.code

    def poll(self) -> int | None:
        return self.code

    def signal(self, sig: int, tree: bool = False) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not self.ignores_term):
            self.exit(-sig)

    def memory_bytes(self) -> int:
        return self.memory

    def gpu_usage(self) -> GpuUsage | None:
        return self.gpu


class FakeKind(LauncherKind):
    name = "fake"


class FakeLauncher(Launcher):
    kind = FakeKind
    started: list[FakeProcess]
    adopted: list[FakeProcess]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        FakeLauncher.started, FakeLauncher.adopted = [], []

    def place(self, n: int) -> list[Slot]:
        return [Slot("localhost", "127.0.0.1", i, i) for i in range(n)]

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        return [20_000 + s.index for s in slots]

    def start(self, proc: ProcessSpec, log_path: Path) -> LaunchedProcess:
        self.started.append(FakeProcess(proc))
        return self.started[-1]

    def adopt(self, pid: int, host: str) -> LaunchedProcess:
        self.adopted.append(FakeProcess(None))
        self.adopted[-1].pid = pid
        return self.adopted[-1]


def plugins(group: str, name: str) -> type:
    return FakeLauncher if group == LAUNCHERS else load_plugin(group, name)


class Harness:
    """A supervisor over a real job directory, pumped by the test."""

    def __init__(self, isolation_warning: str | None = None, **fields):
        fields = {"code": "pass\n", "workers": 2, "backend": "tf", "grace": 0.2, **fields}
        self.job = JobDir.create(JobSpec(**fields))
        self.inbox = ev.Inbox()
        worker = WorkerCommand(["python", "-m", "jupyter_distrain.worker"], {Env.BACKEND: "x"})
        self.sup = Supervisor(
            self.job, self.inbox, worker, plugins=plugins, isolation_warning=isolation_warning
        )
        self.sup.launch()
        self.start_all()

    def start_all(self) -> None:
        """The loop starts one planned process per turn; here, all at once."""
        while self.sup.gen.launching:
            self.sup.start_next()
        self.sup.save()

    @property
    def procs(self) -> dict[ProcessId, FakeProcess]:
        """The latest process started for each id."""
        return {p.proc.id: p for p in FakeLauncher.started}

    def send(self, event) -> None:
        """Dispatch ``event``; what a process says of itself carries its proof, as a
        worker's does (``contract/keys.py``), unless the test gave it one (a forgery)."""
        body = getattr(event, "body", None)
        if isinstance(body, dict) and PROOF not in body and ProcessId.of(body) is not None:
            event.body = prove(self.sup.worker.keys.key(ProcessId.of(body)), body)
        self.sup.dispatch(event)

    def ask(self, event):
        request = ev.Request(event)
        self.sup.dispatch(request)
        return request.future.result(timeout=0)

    def hello(self, pid: ProcessId, os_pid: int | None = None) -> None:
        self.send(ev.Hello(hello(pid, os_pid or self.procs[pid].pid, "localhost", "127.0.0.1")))

    def up(self) -> None:
        for pid in list(self.procs):
            self.hello(pid)

    def exit(self, pid: ProcessId, code: int) -> None:
        """The process exits; its waiter posts the exit, which the loop applies."""
        self.procs[pid].exit(code)
        self.pump()

    def pump(self) -> None:
        """Apply every event posted so far (waiter threads post right after an exit)."""
        while (event := self.inbox.next(0.2)) is not None:
            self.send(event)

    def tick(self) -> None:
        for duty in self.sup.duties:
            duty.tick(float("inf"))

    @property
    def state(self):
        return self.job.read_state()

    def events(self, kind: str) -> list[dict]:
        return [e for e in self.job.read_events() if e["event"] == kind]


@pytest.fixture
def harness(jobs_root):
    made: list[Harness] = []

    def make(**fields) -> Harness:
        made.append(Harness(**fields))
        return made[-1]

    yield make
    for h in made:
        if not h.sup.status.done:
            h.sup.stop("test over")


def test_a_job_runs_once_every_process_says_hello_and_succeeds_when_all_exit_0(harness):
    h = harness()
    assert h.state.state == "launching"
    assert [(p.id, p.state) for p in h.state.processes] == [(W0, "starting"), (W1, "starting")]
    env = h.procs[W1].proc.env
    assert env[Env.ROLE] == "worker" and env[Env.INDEX] == "1" and env[Env.BACKEND] == "x"
    h.hello(W0)
    assert h.state.state == "launching"
    h.hello(W1)
    assert h.state.state == "running" and h.state.running_at
    h.exit(W0, 0)
    assert h.state.state == "running"
    h.exit(W1, 0)
    status = h.state
    assert status.state == "succeeded" and [p.exit_code for p in status.processes] == [0, 0]


def test_the_first_failure_fails_the_job_and_stops_the_others(harness):
    h = harness()
    h.up()
    h.job.log_file(W1).write_text("Traceback\nValueError: bad batch\n")
    h.exit(W1, 1)
    status = h.state
    assert status.state == "failed" and status.error == "rank 1 failed first (exit code 1)"
    assert status.error_tail.endswith("ValueError: bad batch")
    assert h.procs[W0].signals[0] == signal.SIGTERM and h.procs[W0].code == -signal.SIGTERM
    assert not any(p.live for p in status.processes)


def test_a_failure_counts_from_the_bye_when_the_exit_waits_on_the_peers(harness):
    # JAX's (and Horovod's) shutdown at exit waits on the peers: the rank that raised may
    # exit after a peer that failed because it left; its bye says first who failed first
    h = harness(backend="jax")
    h.up()
    h.send(ev.Bye(bye(W1, h.procs[W1].pid, 0)))  # a success waits for the exit
    assert h.state.process(W1).live
    h.send(ev.Bye(bye(W1, h.procs[W1].pid, 1)))
    status = h.state
    assert status.state == "failed" and status.error == "rank 1 failed first (exit code 1)"
    h.procs[W0].exit(1)  # the peer's own failure, after
    h.pump()
    assert h.state.error == "rank 1 failed first (exit code 1)"
    assert h.procs[W1].signals[0] == signal.SIGTERM  # still in its exit: stopped with the rest


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(harness):
    h = harness(workers=1)
    FakeLauncher.started[0].ignores_term = True
    h.up()
    h.send(ev.StopRequested("user"))
    assert h.procs[W0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]
    assert h.state.state == "stopped" and h.state.processes[0].state == "killed"


def test_startup_timeout_names_the_processes_not_up(harness):
    h = harness(workers=3, timeout=0.01)
    h.hello(W1)
    threading.Event().wait(0.02)
    h.tick()
    assert h.state.state == "failed"
    assert h.state.error == "startup timeout: worker-0, worker-2 did not come up within 0.01 s"


def test_memory_is_read_and_the_kill_sent_through_the_launcher(harness):
    h = harness(memory=0.5)
    h.up()
    h.procs[W1].memory = 2**30
    h.tick()
    assert signal.SIGKILL in h.procs[W1].signals
    assert h.state.state == "failed" and h.state.error.startswith("worker 1 exceeded 0.5 GiB")


def test_gpu_usage_is_sampled_through_the_launcher_into_rows_and_the_widget(harness):
    h = harness(gpus=1)
    h.up()
    h.procs[W0].gpu = GpuUsage(87.0, 3 * 2**30)  # W1's devices report nothing (no NVML)
    h.tick()
    h.sup.save()
    rows = {p.id: p for p in h.state.processes}
    assert (rows[W0].gpu_percent, rows[W0].gpu_memory) == (87.0, 3 * 2**30)
    assert rows[W1].gpu_percent is None
    assert gpu_text(rows[W0]) == "87% 3.0 GiB" and gpu_text(rows[W1]) == ""


def test_scaling_asks_for_a_checkpoint_and_restarts_at_the_new_size(harness):
    h = harness(backend="tf")
    with pytest.raises(ValueError, match="cannot scale a job that is launching"):
        h.ask(ev.ScaleRequested(3))
    h.up()
    old = dict(h.procs)
    h.ask(ev.ScaleRequested(3))
    assert h.state.scaling_to == 3
    assert all(p.signals == [signal.SIGUSR1] for p in old.values())
    h.exit(W0, CHECKPOINT_EXIT)
    # rank 1 may still be writing: nobody is stopped until every rank has checkpointed
    assert h.state.state == "running" and old[W1].signals == [signal.SIGUSR1]
    h.exit(W1, CHECKPOINT_EXIT)
    h.start_all()
    status = h.state
    assert status.state == "launching" and status.generation == 1 and status.workers == 3
    assert [p.id for p in status.processes] == [W0, W1, W2] and status.scaling_to is None
    assert h.job.read_spec().workers == 3
    assert h.events("restart")[0]["previous"][1]["exit_code"] == CHECKPOINT_EXIT
    h.send(ev.Exited(W1, old[W1], CHECKPOINT_EXIT))  # a late exit of the old generation
    assert h.state.state == "launching"
    h.up()
    assert h.state.state == "running"


def test_a_rank_failing_while_the_others_checkpoint_fails_the_job_instead_of_restarting(harness):
    h = harness(backend="tf")
    h.up()
    h.ask(ev.ScaleRequested(3))
    h.exit(W1, CHECKPOINT_EXIT)
    h.exit(W0, 1)
    status = h.state
    assert status.state == "failed" and status.generation == 0
    assert status.error.startswith("rank 0 ended (exit code 1) while the job checkpointed")


def test_a_rank_that_never_checkpoints_is_stopped_after_the_drain(harness):
    h = harness(backend="tf")
    h.up()
    h.ask(ev.ScaleRequested(3))
    h.exit(W0, CHECKPOINT_EXIT)
    stuck = h.procs[W1]
    h.sup.scaling.drain.at = 0
    h.tick()
    h.start_all()
    assert stuck.code == -signal.SIGTERM and h.events("drain_timeout")
    assert h.state.generation == 1 and h.state.workers == 3


def test_a_scale_the_workers_never_answer_is_dropped(harness):
    h = harness()
    h.up()
    h.ask(ev.ScaleRequested(3))
    h.sup.scaling.deadline.at = 0
    h.tick()
    assert h.state.scaling_to is None and h.events("scale_failed")


def test_stopping_some_workers_leaves_the_others_and_the_job_decides_later(harness):
    h = harness(workers=3, backend="plain")
    h.up()
    h.send(ev.StopProcesses([W1]))
    h.pump()
    assert h.procs[W1].code == -signal.SIGTERM and h.procs[W0].signals == []
    assert h.state.state == "running" and h.state.process(W1).stopped
    h.exit(W0, 0)
    h.exit(W2, 0)
    assert h.state.state == "succeeded"  # a worker stopped on request is no failure
    h2 = harness(workers=2, backend="plain")
    h2.up()
    h2.send(ev.StopProcesses([W0, W1]))  # every live worker: the job stops as a whole
    assert h2.state.state == "stopped"


def test_mpirun_ranks_are_adopted_on_hello_and_report_their_exits(harness, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    h = harness(backend="horovod", controller="mpi")
    status = h.state
    assert [p.id for p in status.processes] == [W0, W1] and status.processes[0].pid is None
    assert [p.id for p in status.helpers] == [ProcessId("mpirun", 0)]
    mpirun = h.procs[ProcessId("mpirun", 0)]
    assert mpirun.proc.env[Env.IDENTITY_FROM_MPI] == "1"
    h.hello(W0, 501)
    h.hello(W1, 502)
    assert h.state.state == "running" and [a.pid for a in FakeLauncher.adopted] == [501, 502]
    h.ask(ev.ScaleRequested(3))  # the checkpoint request reaches each rank's own pid
    assert [a.signals for a in FakeLauncher.adopted] == [[signal.SIGUSR1]] * 2
    h.send(ev.Bye(bye(W0, 999, 0)))  # a bye from a pid that is not the rank's: ignored
    assert h.state.process(W0).live
    h.send(ev.Bye(bye(W0, 501, 0)))
    assert h.state.process(W0).exit_code == 0
    h.exit(ProcessId("mpirun", 0), 1)  # rank 1 said no bye: it ends with its mpirun
    status = h.state
    assert status.state == "failed" and status.error == "rank 1 failed first (exit code 1)"


def test_parameter_server_rules(harness):
    h = harness(backend="ps", ps=1, code="import tensorflow\n")
    chief, ps0 = ProcessId("chief", 0), ProcessId("ps", 0)
    assert sorted(str(p.id) for p in h.state.processes) == [
        "chief-0",
        "ps-0",
        "worker-0",
        "worker-1",
    ]
    assert h.state.backend_info["cluster"]["ps"] == ["127.0.0.1:20003"]
    assert h.procs[W0].proc.env[Env.MODE] == "server"
    h.up()
    h.exit(W1, -9)  # a lost worker: TensorFlow's coordinator carries on
    assert h.state.state == "running" and h.events("process_lost")[0]["process"] == "worker-1"
    h.exit(chief, 0)
    assert h.state.state == "succeeded" and h.procs[ps0].code == -signal.SIGTERM
    h2 = harness(backend="ps", ps=1)
    h2.up()
    h2.exit(ProcessId("ps", 0), 1)
    assert h2.state.state == "failed" and h2.state.error == "ps 0 died (exit code 1)"


def test_a_chief_failing_after_its_ps_was_killed_names_the_ps(harness):
    """The ps is killed; the chief's call to it fails at once and its exit comes first,
    before the ps's waiter has said anything (under load, as in a full test run): the
    job names the ps, the first to go."""
    h = harness(backend="ps", ps=1)
    h.up()
    ps0 = h.procs[ProcessId("ps", 0)]
    ps0.code = -signal.SIGKILL  # dead; its waiter has not woken yet
    h.exit(ProcessId("chief", 0), 1)
    assert h.state.state == "failed" and h.state.error == "ps 0 died (killed by SIGKILL)"


def test_metrics_update_rows_and_unknown_or_malformed_ids_are_ignored(harness):
    h = harness()
    h.up()
    h.send(ev.Metric({"role": "worker", "index": 1, "time": 5.0, "step": 7, "loss": 0.5}))
    h.send(ev.Metric({"role": "worker", "index": "1", "step": 99}))
    h.send(ev.Metric({"role": "ps", "index": 4, "step": 99}))
    h.tick()
    row = h.state.process(W1)
    assert (row.step, row.loss, row.heartbeat) == (7, 0.5, 5.0)
    assert h.state.process(W0).step is None


def test_a_driver_thread_starts_processes_through_the_loop(harness):
    h = harness()
    h.up()
    proc = h.sup.worker.process(W2, Slot("localhost", "127.0.0.1", 2, 2), rank=2)
    started: list[LaunchedProcess] = []
    thread = threading.Thread(target=lambda: started.append(h.sup.start_process(proc)))
    thread.start()
    h.send(h.inbox.next(5))  # the request the thread posted
    thread.join(5)
    assert started and started[0] is h.procs[W2] and h.state.process(W2).state == "starting"


class Resizable(Services):
    """The plan's services as elastic Horovod's look to the loop: they resize in place."""

    def resize(self, workers: int) -> bool:
        return True


def test_an_in_place_resize_completes_when_every_rank_steps_at_the_new_size(harness):
    h = harness(backend="tf")
    h.sup.gen.plan.services = Resizable()
    h.up()
    h.ask(ev.ScaleRequested(3))
    assert h.events("scaled_in_place") and h.sup.scaling.in_place is not None
    h.sup.start_process(h.sup.worker.process(W2, Slot("localhost", "127.0.0.1", 2, 2), rank=2))
    h.hello(W2)
    assert h.sup.scaling.in_place.phase().startswith("the state sync before a first step at size 3")
    for i, pid in enumerate((W0, W1, W2)):
        h.send(ev.Metric({"role": "worker", "index": pid.index, "step": 10 + i}))
    h.tick()
    assert h.sup.scaling.in_place is None and h.events("scaled")


def test_an_in_place_resize_that_hangs_fails_naming_its_phase(harness):
    h = harness(backend="tf", timeout=0.01)
    h.sup.gen.plan.services = Resizable()
    h.up()
    h.ask(ev.ScaleRequested(3))
    threading.Event().wait(0.02)
    h.tick()
    assert h.state.state == "failed"
    assert h.state.error == (
        "scaling to 3 workers did not complete within 0.01 s: stuck in the rendezvous at size 3 "
        "(2 workers up)"
    )


def test_a_shrink_marks_the_removed_rank_stopped_not_failed(harness):
    h = harness(backend="tf", workers=3)
    h.sup.gen.plan.services = Resizable()
    h.up()
    h.ask(ev.ScaleRequested(2))
    h.exit(W2, -6)  # Horovod aborts the rank it removes
    status = h.state
    assert status.state == "running" and status.process(W2).stopped


def test_a_failure_restarts_the_job_at_the_same_size_until_the_restarts_run_out(harness):
    h = harness(max_restarts=2)
    for restart in (1, 2):
        h.up()
        h.exit(W1, 3)
        status = h.state
        assert (status.state, status.generation, status.restarts) == ("launching", restart, restart)
        assert status.warnings[-1] == (
            f"restart {restart} of 2 after rank 1 failed first (exit code 3); "
            "its log keeps the traceback"
        )
        assert [p.state for p in status.processes] == ["pending", "pending"]  # the new ones
        h.start_all()
    assert [e["reason"] for e in h.events("restart")] == ["rank 1 failed first (exit code 3)"] * 2
    h.up()
    h.exit(W1, 3)  # no restart left: the job fails with the last failure, as without the flag
    status = h.state
    assert (status.state, status.error, status.restarts) == (
        "failed",
        "rank 1 failed first (exit code 3)",
        2,
    )


def test_a_lost_host_is_left_out_under_min_workers_while_enough_workers_remain(
    harness, monkeypatch
):
    def place(launcher: FakeLauncher, n: int) -> list[Slot]:
        hosts = [h for h in ("h0", "h1", "h2") if h not in launcher.spec.left_out]
        return [Slot(host, "10.0.0.1", i, 0) for i, host in enumerate(hosts[:n])]

    monkeypatch.setattr(FakeLauncher, "place", place)
    h = harness(workers=3, max_restarts=3, min_workers=2)
    h.up()
    h.procs[W1].lost = True
    h.exit(W1, 255)
    status = h.state
    assert (status.state, status.workers, status.restarts) == ("launching", 2, 1)
    assert status.warnings[-1] == (
        "restart 1 of 3 after rank 1 failed first (exit code 255); host h1 was lost: "
        "going on without it at 2 workers; its log keeps the traceback"
    )
    assert h.job.read_spec().left_out == ["h1"]
    assert [p.host for p in status.processes] == ["h0", "h2"]
    h.start_all()
    h.up()
    h.ask(ev.ScaleRequested(3))  # the user scales back up: every host is asked again
    for pid in (W0, W1):
        h.exit(pid, CHECKPOINT_EXIT)
    status = h.state
    assert (status.state, status.workers, h.job.read_spec().left_out) == ("launching", 3, [])
    assert [p.host for p in status.processes] == ["h0", "h1", "h2"]
    h.start_all()
    h.up()
    h.procs[W0].lost, h.procs[W2].lost = True, True  # two hosts: one worker would be left
    h.exit(W0, 255)
    status = h.state
    assert (status.state, status.error) == (
        "failed",
        "rank 0 failed first (exit code 255); hosts h0, h2 were lost and 1 worker would be "
        "left, fewer than --min-workers 2",
    )


def test_without_min_workers_a_lost_host_restarts_the_job_at_its_size(harness):
    h = harness(max_restarts=1)
    h.up()
    h.procs[W1].lost = True
    h.exit(W1, 255)
    status = h.state
    assert (status.state, status.workers, h.job.read_spec().left_out) == ("launching", 2, [])
    assert (
        "host localhost was lost: restarting at the same size (no --min-workers)"
        in (status.warnings[-1])
    )


def test_without_max_restarts_a_failure_fails_the_job_and_a_stop_is_never_restarted(harness):
    h = harness()
    h.up()
    h.exit(W1, 3)
    assert (h.state.state, h.state.restarts) == ("failed", 0)
    h2 = harness(max_restarts=3)
    h2.up()
    h2.sup.stop("user")
    assert (h2.state.state, h2.state.restarts) == ("stopped", 0)


def test_a_stall_is_said_once_naming_the_ranks_their_steps_and_where_they_stand(harness):
    h = harness(stall_timeout=5, workers=3)
    h.up()
    for pid in (W0, W1, W2):
        h.send(ev.Metric({"role": "worker", "index": pid.index, "step": 7}, received=0.0))
    h.tick()
    assert [p.signals for p in h.procs.values()] == [[STACKS_SIGNAL]] * 3  # asked once
    assert h.state.warnings == []  # said with the stacks, once they are in
    for pid, line in ((W0, 9), (W1, 4), (W2, 9)):
        h.send(ev.StacksTaken(stacks_answer(pid, line)))
    h.tick()
    h.tick()
    assert [p.signals for p in h.procs.values()] == [[STACKS_SIGNAL]] * 3
    (warning,) = h.state.warnings
    head, *stacks = warning.splitlines()
    assert head.startswith("training stalled: no step since"), head
    assert head.endswith(
        "rank 0 at step 7, rank 1 at step 7, rank 2 at step 7; rank 1 stands apart"
    )
    assert stacks[1] == "  rank 1: train.py:4 in wait_here  time.sleep(60)"
    assert stacks[3] == "  ranks 0, 2: train.py:9 in wait_here  time.sleep(60)"
    assert [e["reason"] for e in h.events("stacks")] == ["stall"]
    assert "rank 1: train.py:4" in (h.job.stacks_dir / "001-stall.txt").read_text()


def stacks_answer(pid: ProcessId, line: int, **extra) -> dict:
    """What a worker standing at train.py ``line`` answers (``ProcessStacks.to_dict``)."""
    frame = Frame("train.py", line, "wait_here", "time.sleep(60)", own=True)
    stacks = ProcessStacks(
        str(pid), "told by the process", threads=[ThreadStack("MainThread", [frame], main=True)]
    )
    return {**pid.fields(), "stacks": {**stacks.to_dict(), **extra}}


def test_stacks_on_request_ask_every_running_process_once_and_keep_the_report(harness):
    h = harness(workers=3)
    h.up()
    first, second = Future(), Future()
    h.send(ev.StacksRequested(first))
    h.send(ev.StacksRequested(second))  # joins the collection under way
    assert [p.signals for p in h.procs.values()] == [[STACKS_SIGNAL]] * 3
    h.send(ev.StacksTaken(stacks_answer(W2, 9)))
    h.send(ev.StacksTaken(stacks_answer(ProcessId("worker", 7), 9)))  # no such process
    h.send(ev.StacksTaken({**W0.fields(), "stacks": {"threads": "garbage"}}))  # unreadable
    h.send(ev.StacksTaken(stacks_answer(W0, 9)))
    assert not first.done()
    h.send(ev.StacksTaken(stacks_answer(W1, 4)))
    assert first.result(0) == second.result(0) == {"file": "001-request.json"}
    (report,) = h.job.read_stacks()
    # names and hosts come from the table, not from what a process says of itself
    assert [(p.process, p.name, p.host) for p in report.processes] == [
        ("worker-0", "rank 0", "localhost"),
        ("worker-1", "rank 1", "localhost"),
        ("worker-2", "rank 2", "localhost"),
    ]
    assert [g.names for g in report.groups()] == [["rank 1"], ["rank 0", "rank 2"]]
    assert h.state.state == "running" and h.state.warnings == []
    h.send(ev.StacksTaken(stacks_answer(W1, 4)))  # late: nothing waits for it
    assert len(h.job.read_stacks()) == 1


def test_native_frames_are_read_through_each_process_s_handle_when_asked(harness):
    h = harness()
    h.up()
    h.procs[W1].native_stack = lambda: "Thread 7 (idle): MainThread\n    clock_nanosleep (libc)"
    asked = Future()
    h.send(ev.StacksRequested(asked, native=True))
    for pid, line in ((W0, 9), (W1, 4)):
        h.send(ev.StacksTaken(stacks_answer(pid, line)))
    h.pump()  # the readings, each from a thread of its own
    assert asked.result(0) == {"file": "001-request.json"}
    report = h.job.read_stacks()[0]
    assert [p.native for p in report.processes] == [
        "native frames: only for processes on this machine",  # the default handle's word
        "Thread 7 (idle): MainThread\n    clock_nanosleep (libc)",
    ]
    assert "      rank 1, native (py-spy):\n        Thread 7 (idle)" in report.text()


def test_a_process_that_does_not_answer_is_named_when_the_collection_ends(harness):
    h = harness()
    h.up()
    asked = Future()
    h.send(ev.StacksRequested(asked))
    h.send(ev.StacksTaken(stacks_answer(W0, 9)))
    h.sup.stacks.current.deadline = Deadline(0)
    h.tick()
    report = h.job.read_stacks()[0]
    assert asked.result(0) == {"file": "001-request.json"}
    assert report.processes[1].error.startswith(f"no answer within {ANSWER_SECONDS:g} s: stopped")
    assert "rank 1: no answer within" in report.text()


def test_stacks_asked_before_any_process_runs_or_after_the_end_say_why(harness):
    h = harness()
    early = Future()
    h.send(ev.StacksRequested(early))
    with pytest.raises(RuntimeError, match="no process of the job is running yet"):
        early.result(0)
    h.up()
    pending = Future()
    h.send(ev.StacksRequested(pending))
    h.exit(W0, 0)
    h.exit(W1, 0)
    with pytest.raises(RuntimeError, match="the job has ended"):
        pending.result(0)


def test_a_second_scale_request_changes_the_size_without_signalling_again(harness):
    # a second SIGUSR1 can reach a rank that has checkpointed and is shutting down, when
    # Python has given the signal its default action back: it died of it (exit -10)
    h = harness(backend="tf")
    h.up()
    h.ask(ev.ScaleRequested(3))
    h.ask(ev.ScaleRequested(4))
    assert [p.signals for p in h.procs.values()] == [[signal.SIGUSR1]] * 2
    assert h.state.scaling_to == 4


def test_on_hosts_the_user_asked_for_the_open_ports_are_named_once(harness, monkeypatch):
    monkeypatch.setattr(FakeKind, "runs_on_other_hosts", classmethod(lambda cls, spec: True))
    h = harness(isolation_warning="the fake launcher runs the job on other hosts")
    (warning,) = h.state.warnings
    assert warning == (
        "the fake launcher runs the job on other hosts: reachable by other hosts: "
        "TensorFlow gRPC (unauthenticated) on ports 20000, 20001"
    )


ELASTIC = "import horovod.tensorflow as hvd\n@hvd.elastic.run\ndef train(state):\n    pass\n"


# each starts a server that runs what it is sent: reached by a neighbour, it runs their
# code (Horovod elastic's rendezvous unpickles, TensorFlow's gRPC servers run any graph)
@pytest.mark.parametrize(
    "backend, code, said",
    [
        ("horovod", ELASTIC, "Horovod elastic's rendezvous server unpickles what any caller"),
        ("tf", "", "TensorFlow's gRPC servers run any graph a caller sends them"),
        ("ps", "", "TensorFlow's gRPC servers run any graph a caller sends them"),
    ],
)
def test_without_isolation_a_job_whose_server_runs_code_is_refused_before_it_starts(
    harness, backend, code, said
):
    fields = {"backend": backend, **({"code": code} if code else {})}
    h = harness(
        isolation_warning="no private network namespace (Operation not permitted)", **fields
    )
    status = h.state
    assert status.state == "failed" and status.error.startswith(
        f"not started: no private network namespace (Operation not permitted), and {said}"
    )
    assert "run it where user namespaces are allowed, or " in status.error
    assert "\n" not in status.error and FakeLauncher.started == [] and h.sup.gen.plan is None
    # isolated, the same job is planned (its servers on loopback of its own network)
    assert harness(**fields).sup.gen.plan is not None


def test_a_remote_process_reported_after_its_hello_gets_its_pid_and_pool_in_its_row(harness):
    """A host's agent reports its process's pid, and whether the host's pool gave it, on
    the ssh connection; the process's hello comes on the job's channel and can arrive
    first (a pooled process says it at once): the row takes them when the report comes."""
    h = harness()
    remote = h.procs[W1]
    os_pid, remote.pid = remote.pid, 0  # the agent has not reported yet
    h.sup.table.entry(W1).record.pid = 0
    h.hello(W0)
    h.hello(W1, os_pid)
    remote.pid, remote.create_time, remote.pooled = os_pid, 1234.5, True  # the report
    h.tick()
    h.sup.save()
    row = {p.id: p for p in h.state.processes}[W1]
    assert (row.pid, row.create_time, row.pooled) == (os_pid, 1234.5, True)


def _session(harness, workers: int = 2) -> Harness:
    """A session whose ranks all said hello, running cells."""
    h = harness(session="s", workers=workers, backend="plain")
    for pid, proc in h.procs.items():
        h.send(ev.Hello(hello(pid, proc.pid, "localhost", "127.0.0.1", cells=True)))
    return h


def _answer(h: Harness, index: int) -> list[str]:
    """Which ranks answered cell ``index`` and how, as the notebook is told."""
    answers = h.ask(session.CellStatusAsked(index))["answers"]
    return sorted(f"{p}:{a['state']}" for p, a in answers.items())


def test_a_cell_answer_counts_only_from_the_process_it_names_and_for_a_written_cell(harness):
    """Every rank holds the job's secret: an answer signed with it alone, or with another
    rank's key, or for a cell the notebook has not written, is refused (said in the
    job's events) and the cell waits for the rank's own answer."""
    h = _session(harness)
    cells.write_cell(h.job.path, cells.Cell(1, "x = 1"))
    h.ask(session.CellPosted(1))
    forged = cells.cell_done(W0, 1, "ok", result=b"planted")
    h.send(session.CellDone({**forged, PROOF: "0" * 64}))  # the secret only
    h.send(session.CellDone(prove(h.sup.worker.keys.key(W1), forged)))  # rank 1's key
    h.send(session.CellDone(cells.cell_done(W1, 2, "error", "Boom: early")))  # not written
    assert _answer(h, 1) == [] and _answer(h, 2) == []
    refused = h.events("cell_answer_refused")
    assert [(e["process"], e["cell"]) for e in refused] == [
        ("worker-0", 1),
        ("worker-0", 1),
        ("worker-1", 2),
    ]
    assert "not written" in refused[2]["reason"] and "proof" in refused[0]["reason"]
    assert not cells.interrupt_file(h.job.path, 2).exists()  # nothing was interrupted
    h.send(session.CellDone(cells.cell_done(W0, 1, "ok", result=b"real")))
    h.send(session.CellDone(cells.cell_done(W1, 1, "ok")))
    assert _answer(h, 1) == ["worker-0:ok", "worker-1:ok"]
    said = h.ask(session.CellStatusAsked(1))["answers"]["worker-0"]
    assert said["digest"] == cells.digest(b"real") and "result" not in said
    inline = h.ask(session.CellResultAsked(1, "worker-0"))["result"]
    assert base64.b64decode(inline) == b"real"


def test_a_ranks_early_failure_on_a_written_cell_interrupts_that_cell(harness):
    """A quick local rank may answer before the notebook's word of the cell reaches the
    supervisor: once the cell's file is there, its failure marks that cell (not the one
    before), and its own later "interrupted" does not replace the failure."""
    h = _session(harness)
    cells.write_cell(h.job.path, cells.Cell(1, "1 / 0"))
    h.send(session.CellDone(cells.cell_done(W1, 1, "error", "Boom: early")))
    assert cells.interrupt_file(h.job.path, 1).exists()
    assert h.procs[W0].signals == [signal.SIGINT] and h.procs[W1].signals == []
    h.ask(session.CellPosted(1))
    h.send(session.CellDone(cells.cell_done(W1, 1, "interrupted", "KeyboardInterrupt")))
    h.send(session.CellDone(cells.cell_done(W0, 1, "interrupted", "KeyboardInterrupt")))
    assert _answer(h, 1) == ["worker-0:interrupted", "worker-1:error"]


def test_a_cells_status_stays_small_whatever_the_number_of_ranks_and_results(harness):
    """64 ranks each sending a 32 KiB result and a long error: the status carries
    states, digests and the first errors only (results are asked one at a time)."""
    h = _session(harness, workers=64)
    cells.write_cell(h.job.path, cells.Cell(1, "x", out=True, out_all=True))
    h.ask(session.CellPosted(1))
    for pid in h.procs:
        state = "error" if pid.index % 2 else "ok"
        body = cells.cell_done(pid, 1, state, "E" * 5000, result=b"r" * cells.INLINE_OUT_BYTES)
        h.send(session.CellDone(body))
    reply = h.ask(session.CellStatusAsked(1))
    assert len(reply["answers"]) == 64
    assert len(json.dumps(reply)) < 16 * 1024
    errors = [p for p, a in reply["answers"].items() if "error" in a]
    assert sorted(errors, key=ProcessId.parse) == ["worker-1", "worker-3", "worker-5", "worker-7"]
    assert len(h.ask(session.CellResultAsked(1, "worker-63"))["result"]) > 40_000
