"""Fixtures: a private jobs root, and real IPython kernels driven over ZMQ."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from jupyter_client.manager import KernelManager

from jupyter_distrain.client import standby
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.spec import JobSpec
from jupyter_distrain.contract.stacks import StacksReport
from jupyter_distrain.contract.store import JobDir, list_job_dirs

# pytest-xdist (make test runs a battery in several workers, a module's tests in one
# worker: --dist loadfile): each worker its own per-user runtime and cache directories,
# as separate logins of the account have
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    _private = Path(f"/tmp/jd-{WORKER}-{os.getuid()}")
    _private.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(_private)
    os.environ["XDG_CACHE_HOME"] = str(_private / "cache")


@pytest.fixture(autouse=True)
def jobs_root(tmp_path_factory, monkeypatch) -> Path:
    """A private jobs root; every job a test leaves running is stopped at teardown."""
    root = tmp_path_factory.mktemp("jobs")
    monkeypatch.setenv("JUPYTER_DISTRAIN_ROOT", str(root))
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "0")  # pools are on in tests/test_pool.py only
    yield root
    standby.discard()  # a test with pools on leaves its process one
    for job_dir in list_job_dirs(root):
        job = Job(job_dir)
        if job_dir.read_control() is not None and not job.done:  # a supervisor was started
            job.stop()


@dataclass
class CellOutput:
    stdout: str = ""
    stderr: str = ""
    result: str = ""
    error: dict | None = None
    messages: list = field(default_factory=list)

    @property
    def error_text(self) -> str:
        if not self.error:
            return ""
        return f"{self.error['ename']}: {self.error['evalue']}"


class Kernel:
    """A real IPython kernel in its own process, with the extension loaded."""

    def __init__(self, root: Path, cwd: Path):
        self.km = KernelManager(kernel_name="python3")
        env = {**os.environ, "JUPYTER_DISTRAIN_ROOT": str(root)}
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        out = self.execute("%load_ext jupyter_distrain")
        assert out.error is None, out.error

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def submit(self, code: str) -> str:
        return self.kc.execute(code)

    def collect(self, msg_id: str, timeout: float = 240, on_message=None) -> CellOutput:
        """The cell's output until it ends; ``on_message(msg)`` sees each of its IOPub
        messages as it arrives (a front-end's part: answering a widget's comm)."""
        out = CellOutput()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell still running after {timeout} s:\n{out.stdout}")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            out.messages.append(msg)
            if on_message is not None:
                on_message(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind == "error":
                out.error = content
            elif kind == "execute_result":
                out.result += content["data"].get("text/plain", "")
            elif kind == "status" and content["execution_state"] == "idle":
                return self._reply(msg_id, out, deadline)

    def _reply(self, msg_id: str, out: CellOutput, deadline: float) -> CellOutput:
        """Errors shown without a traceback (UsageError) only appear in the shell reply."""
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content["status"] == "error" and out.error is None:
            out.error = content
        return out

    def execute(self, code: str, timeout: float = 240) -> CellOutput:
        return self.collect(self.submit(code), timeout)

    def shutdown(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(jobs_root, tmp_path):
    k = Kernel(jobs_root, tmp_path)
    yield k
    k.shutdown()


@pytest.fixture
def new_kernel(jobs_root, tmp_path):
    """A factory for extra kernels sharing the same jobs root."""
    made: list[Kernel] = []

    def make() -> Kernel:
        made.append(Kernel(jobs_root, tmp_path))
        return made[-1]

    yield make
    for k in made:
        k.shutdown()


def running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie has finished running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def only_job(root: Path) -> JobDir:
    jobs = list_job_dirs(root)
    assert len(jobs) == 1, [j.id for j in jobs]
    return jobs[0]


def job_pids(job: JobDir) -> list[int]:
    """The supervisor's pid and every pid the job recorded."""
    return Job(job).pids()


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def failed_seconds_after_exit(job: JobDir, process: str = "worker-1") -> float:
    """How long after ``process`` exited the job was failed (from its events)."""
    events = job.read_events()
    exited = next(e["time"] for e in events if e.get("process") == process and e["event"] == "exit")
    failed = next(e["time"] for e in events if e.get("state") == "failed")
    return failed - exited


MISSING_PACKAGE = """\
import sys
sys.modules[{package!r}] = None  # what Python answers where it cannot be imported
from jupyter_distrain import JobSpec, SpecError, submit
for backend in ({package!r}, "auto"):
    try:
        submit(JobSpec(code="import {package}\\n", workers=2, backend=backend))
    except SpecError as exc:
        print(exc)
"""


def refusals_without(package: str) -> list[str]:
    """What ``--backend PACKAGE`` and ``--backend auto`` say of a cell importing
    ``package``, in a fresh interpreter where ``package`` cannot be imported."""
    run = subprocess.run(
        [sys.executable, "-c", MISSING_PACKAGE.format(package=package)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def fault_row(fault: str, survived: bool, state: str, left: int, outside: int = 0) -> None:
    """One row for benchmarks/fault_table.py (appended to $FAULT_REPORT when set)."""
    path = os.environ.get("FAULT_REPORT")
    if path:
        row = {"fault": fault, "survived": survived, "state": state, "processes_left": left}
        with open(path, "a") as f:
            f.write(json.dumps({**row, "lines_lost": 0, "files_outside": outside}) + "\n")


# a program whose rank 1 stands apart: it waits in load_batch (line 6) while every other
# rank waits in wait_for_peers; each says "up" first
STACKS_PROGRAM = (
    "import os, time\n"
    "print('up', flush=True)\n"
    "def wait_for_peers():\n"
    "    time.sleep(300)\n"
    "def load_batch():\n"
    "    time.sleep(300)\n"
    "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
    "    load_batch()\n"
    "else:\n"
    "    wait_for_peers()\n"
)


def wait_until_up(job: Job, ranks: int, timeout: float = 120) -> None:
    """Until every rank of a job running ``STACKS_PROGRAM`` has said "up"."""

    def up() -> bool:
        if job.done:
            raise AssertionError(f"the job ended: {job.status().error}")
        logs = [job.dir.log_file(ProcessId("worker", r)) for r in range(ranks)]
        return all(log.exists() and "up" in log.read_text() for log in logs)

    wait_for(up, timeout, interval=0.3, what="every rank up")


# the same in a torch DDP program: rank 1 loads a batch (line 5), the others wait for it
# in all_reduce (line 8)
def checkpointed_ddp(steps: int, each_step: str, end: str) -> str:
    """A DDP program of ``jupyter_distrain.torch.checkpointed`` state (saved when the
    supervisor asks, and every ``--checkpoint-every``) that trains to step ``steps``, runs
    ``each_step`` after each step's save, then ``end``."""
    indented = "".join(f"    {line}\n" for line in each_step.splitlines())
    return (
        "import os, pathlib, time\n"
        "import torch, torch.distributed as dist\n"
        "import jupyter_distrain.torch as jdt\n"
        "jdt.setup()\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "state = jdt.checkpointed(model=model, optimizer=optimizer, step=0)\n"
        f"while state.step < {steps}:\n"
        "    optimizer.zero_grad()\n"
        "    model(torch.ones(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
        "    state.step += 1\n"
        "    state.save_if_asked()\n"
        f"{indented}{end}\n"
    )


# Slow enough to lose a host mid-run; says its world size at the end: the ssh and Slurm
# tests of a lost host left out under --min-workers
SHRINKING_PROGRAM = checkpointed_ddp(
    150,
    'print("step", state.step, flush=True)\ntime.sleep(0.05)',
    'print("ended at step", state.step, "of", dist.get_world_size(), "ranks", flush=True)',
)


def shrinking_spec(**launcher: object) -> JobSpec:
    """SHRINKING_PROGRAM on 2 workers of ``launcher`` that may go on without a lost host:
    ``--max-restarts 1 --min-workers 1 --checkpoint-every 5 --grace 1``."""
    return JobSpec(
        code=SHRINKING_PROGRAM,
        workers=2,
        backend="torch",
        max_restarts=1,
        min_workers=1,
        checkpoint_every="5",
        grace=1,
        **launcher,
    )


def check_went_on_without(job: Job, lost: str) -> None:
    """A SHRINKING_PROGRAM job of 2 workers with ``--max-restarts 1 --min-workers 1`` whose
    host ``lost`` went down: it restarted once without that host, at 1 worker, resumed
    from a checkpoint of step 20 or later and ran to its end."""
    status = job.status()
    assert (status.restarts, status.workers, job.dir.read_spec().left_out) == (1, 1, [lost])
    (said,) = [w for w in status.warnings if w.startswith("restart ")]
    assert f"host {lost} was lost: going on without it at 1 worker" in said, said
    log0 = job.logs(ProcessId("worker", 0))
    resumed = re.search(r"resumed from the checkpoint of step (\d+)", log0)
    assert resumed and int(resumed.group(1)) >= 20, log0
    assert log0.rstrip().endswith("ended at step 150 of 1 ranks"), log0


TORCH_STACKS_PROGRAM = (
    "import time, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "print('up', flush=True)\n"
    "def load_batch():\n"
    "    time.sleep(300)\n"
    "if dist.get_rank() == 1:\n"
    "    load_batch()\n"
    "dist.all_reduce(torch.ones(1))\n"
)


def check_stacks_of_the_odd_rank(job: Job, ranks: int, lines_before: int = 0) -> StacksReport:
    """Take the stacks of a job running ``STACKS_PROGRAM`` (after ``lines_before`` lines)
    on ``ranks`` ranks: rank 1 stands apart, first, at its line; the others together; the
    job runs on; the report is kept."""
    load, wait = 6 + lines_before, 4 + lines_before
    return check_stacks(
        job,
        ranks,
        f"train.py:{load} in load_batch  time.sleep(300)",
        f"train.py:{wait} in wait_for_peers  time.sleep(300)",
    )


def check_torch_stacks(job: Job, ranks: int) -> StacksReport:
    """:func:`check_stacks_of_the_odd_rank` for ``TORCH_STACKS_PROGRAM``: the others in
    all_reduce."""
    return check_stacks(
        job,
        ranks,
        "train.py:5 in load_batch  time.sleep(300)",
        "all_reduce ← train.py:8  dist.all_reduce(torch.ones(1))",
    )


def check_stacks(job: Job, ranks: int, odd: str, others_at: str) -> StacksReport:
    """Rank 1's stack stands apart at ``odd``, the others' together at ``others_at``."""
    wait_until_up(job, ranks)
    report = job.stacks()
    others = [f"rank {r}" for r in range(ranks) if r != 1]
    expected = sorted([["rank 1"], others], key=lambda names: (len(names), names[0]))
    groups = {tuple(g.names): g for g in report.groups()}
    assert [g.names for g in report.groups()] == expected, report.text()
    assert groups[("rank 1",)].headline() == f"rank 1: {odd}", report.text()
    stack = groups[tuple(others)].stack
    assert stack is not None and stack.summary() == others_at, report.text()
    assert report.odd_ones_out() == (["rank 1"] if ranks > 2 else [])
    status = job.status()  # taken without stopping anything
    assert status.state == "running", status.error
    assert [p.state for p in status.processes] == ["running"] * ranks
    assert [r.reason for r in job.kept_stacks()] == ["request"]
    return report


def restart_after_killing_rank_1(job: Job, up: str) -> str:
    """Kill rank 1 of a ``--max-restarts 1`` job once its log says ``up`` (the test hosts
    and nodes share this pid space); wait for the next generation to run; return the
    restart's warning."""
    log = job.dir.log_file(ProcessId("worker", 1))
    wait_for(lambda: log.exists() and up in log.read_text() or job.done, 60, what="rank 1 up")
    worker = next(p for p in job.status().processes if p.index == 1)
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(
        lambda: job.status().generation == 1 and job.state == "running" or job.done,
        120,
        what="the restart",
    )
    status = job.status()
    assert (status.state, status.restarts) == ("running", 1), status.error
    (said,) = [w for w in status.warnings if w.startswith("restart ")]
    return said
