"""Interactive sessions from a real kernel (``%%distributed --session NAME``): ranks that
stay up between cells, their state kept; interrupts, crashes, Stop and kernel shutdown."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import pytest
from conftest import job_pids, only_job, running, wait_for

from jupyter_distrain.client.job import Job, JobFailed
from jupyter_distrain.client.session import CellRun, next_index
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.session import cell_done, cell_request

TORCH_SESSION = """%%distributed --session s --workers 2 --backend torch
import torch
import torch.distributed as dist
dist.init_process_group()
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train(steps):
    for _ in range(steps):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()
print("ready on rank", rank, "of", dist.get_world_size())
"""


def forging_cell(marker: str, name: str, out: str) -> str:
    """A session cell in which rank 1, holding the job's secret (and its own key, read
    back from its first environment), answers this cell for rank 0 and the next cell for
    both ranks before the notebook writes it, each with a pickle that creates ``marker``
    when loaded; rank 0 takes 3 s and gives 42. Run as the audit's probes were."""
    return f"""%%distributed --session {name} --out {out}
import os, pickle, time
from pathlib import Path
from jupyter_distrain.contract import control
from jupyter_distrain.contract.process import ProcessId, WorkerChannels
try:
    from jupyter_distrain.contract.keys import prove
except ImportError:  # before per-process keys
    prove = lambda key, body: body
from jupyter_distrain.contract.session import cell_done, cell_request
class Trap:
    def __reduce__(self):
        return (open, ({marker!r}, 'w'))
if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':
    channels = WorkerChannels.from_env()
    first = open('/proc/self/environ', 'rb').read().split(b'\\0')
    key = next((v[21:].decode() for v in first if v.startswith(b'JUPYTER_DISTRAIN_KEY=')), '')
    cells = Path(channels.job_dir, 'session')
    now = max(int(p.name.split('.')[0]) for p in cells.glob('*.json'))
    planted = pickle.dumps({{'defined': True, 'value': Trap()}})
    for index, rank in ((now, 0), (now + 1, 0), (now + 1, 1)):
        body = prove(key, cell_done(ProcessId('worker', rank), index, 'ok', '', planted))
        control.request(channels.control, channels.secret, body)
    result = None
else:
    time.sleep(3)
    result = 42
"""


def check_forged_answers_are_refused(kernel, job: Job, name: str, marker) -> None:
    """:func:`forging_cell`, then the pre-answered cell: each waits for rank 0's own
    answer and binds rank 0's own value; nothing is unpickled; the refusals are said."""
    refused = len([e for e in job.dir.read_events() if e["event"] == "cell_answer_refused"])
    started = time.monotonic()
    out = kernel.execute(forging_cell(str(marker), name, "forged"))
    assert out.error is None, out.error_text + out.stdout[-3000:]
    assert time.monotonic() - started > 3  # it waited for rank 0
    out = kernel.execute(
        f"%%distributed --session {name} --out again\nimport time\ntime.sleep(1)\nresult = 43\n"
    )
    assert out.error is None, out.error_text + out.stdout[-3000:]
    assert kernel.execute("print(forged, again)").stdout.strip() == "42 43"
    assert not marker.exists()
    events = [e for e in job.dir.read_events() if e["event"] == "cell_answer_refused"]
    assert len(events) - refused == 3, events


def _gone(pids: list[int]) -> bool:
    return not any(running(p) for p in pids)


def _logs_saying(job: Job, text: str) -> int:
    """How many of the job's processes have printed ``text``."""
    return sum(text in p.read_text(errors="replace") for p in job.dir.log_files().values())


def test_a_torch_session_keeps_state_across_cells_and_its_ranks_agree(kernel, jobs_root):
    out = kernel.execute(TORCH_SESSION)
    assert out.error is None, out.stderr + out.stdout
    assert "ready on rank 0 of 2" in out.stdout and "ready on rank 1 of 2" in out.stdout
    job = Job(only_job(jobs_root))
    pids = job_pids(job.dir)
    # a later cell: the same processes, the model from the first cell, DDP in step
    out = kernel.execute(
        "%%distributed --session s --out weights --out-all\n"
        "last = train(20)\n"
        "result = [p.detach().clone() for p in model.parameters()]\n"
        "print('trained on rank', rank, 'in pid', __import__('os').getpid())\n"
    )
    assert out.error is None, out.stderr + out.stdout
    assert "trained on rank 0" in out.stdout and "trained on rank 1" in out.stdout
    assert "ready on rank" not in out.stdout  # only this cell's output
    assert job_pids(job.dir) == pids and job.state == "running"
    out = kernel.execute(
        "import torch\nprint(len(weights), all(torch.equal(a, b) for a, b in zip(*weights)))"
    )
    assert out.stdout.strip() == "2 True", out.stdout + out.stderr
    # a notebook value pushed in; rank 0's `result` back
    kernel.execute("lr = 0.01")
    out = kernel.execute(
        "%%distributed --session s --push lr --out final\n"
        "for g in opt.param_groups:\n    g['lr'] = lr\n"
        "result = (rank, opt.param_groups[0]['lr'], train(5))\n"
    )
    assert out.error is None, out.stderr + out.stdout
    out = kernel.execute("print(final[:2])")
    assert out.stdout.strip() == "(0, 0.01)"
    # every rank's output of a cell is shown, however soon its answer comes after it
    for cell in range(15):
        out = kernel.execute(f"%%distributed --session s\nprint('cell {cell} on rank', rank)\n")
        shown = [f"[{r}] cell {cell} on rank {r}" in out.stdout for r in (0, 1)]
        assert shown == [True, True], out.stdout
    # the cells, pushed values and results are the user's alone
    session_dir = job.dir.path / "session"
    assert stat.S_IMODE(session_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in session_dir.iterdir()} == {0o600}
    # a resize would lose the ranks' state: refused in one line, the session untouched
    out = kernel.execute("%distributed scale s 3")
    assert "a session's variables live in its ranks" in out.error_text, out.error_text
    out = kernel.execute("%%distributed --session s --workers 3\nprint('never')\n")
    assert "--workers 3 (it has 2)" in out.error_text and "never" not in out.stdout
    assert job_pids(job.dir) == pids and job.state == "running"
    listed = kernel.execute("%distributed list").stdout
    assert job.id in listed and "session s" in listed
    out = kernel.execute(f"%distributed stop {job.id}")
    wait_for(lambda: _gone(pids), 15, what="the session's processes to end")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--session 'two words'", "--session must be 1-40 letters"),
        ("--keep-session", "--keep-session is for a session: add --session NAME"),
        ("--out-all --out x", "--out-all is for a session: add --session NAME"),
        ("--session s --max-restarts 1", "a session cannot use --max-restarts"),
        ("--session s --background", "--background is for jobs"),
        ("--session s --ps 1", "a program that defines run(cluster, server, task_index)"),
    ],
)
def test_bad_session_flags_are_one_line_and_launch_nothing(line, said, jobs_root):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_distrain.client.magics import DistributedMagics

    magics = DistributedMagics(InteractiveShell.instance())
    cell = "def run(cluster, server, task_index):\n    print('never')\n"
    with pytest.raises(UsageError, match=re.escape(said)):
        magics.distributed(line, cell)
    assert list(jobs_root.iterdir()) == []


def test_an_interrupt_leaves_the_session_usable_and_a_crash_ends_it(kernel, jobs_root):
    out = kernel.execute("%%distributed --session i --workers 2 --backend plain\ncount = 0\n")
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))
    pids = job_pids(job.dir)
    msg = kernel.submit(
        "%%distributed --session i\nimport time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
    )
    wait_for(lambda: _logs_saying(job, "sleeping") == 2, 30, what="both ranks asleep")
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg, timeout=60)
    assert "KeyboardInterrupt" in out.error_text + out.stdout + out.stderr
    assert job.state == "running"
    out = kernel.execute("%%distributed --session i --out c\ncount += 1\nresult = count\n")
    assert out.error is None, out.stderr + out.stdout
    assert kernel.execute("print(c)").stdout.strip() == "1"
    # --out asks for rank 0's value: what another rank leaves is never unpickled
    marker = jobs_root.parent / "unpickled"
    out = kernel.execute(
        "%%distributed --session i --out c\nimport os, pickle\n"
        "class Trap:\n"
        f"    def __reduce__(self):\n        return (open, ({str(marker)!r}, 'w'))\n"
        "result = count\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n"
        "    with open('{}/session/3.worker-1.out.pkl'.format(os.environ['JUPYTER_DISTRAIN_JOB_DIR']), 'wb') as f:\n"
        "        pickle.dump({'defined': True, 'value': Trap()}, f)\n"
        "    result = None\n"
    )
    assert out.error is None, out.stderr + out.stdout
    assert kernel.execute("print(c)").stdout.strip() == "1" and not marker.exists()
    # a cell that raises on one rank: the others are interrupted, the session goes on
    out = kernel.execute(
        "%%distributed --session i\nimport os, time\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n    1 / 0\ntime.sleep(600)\n"
    )
    assert "failed on rank 1: ZeroDivisionError" in out.error_text, out.error_text
    assert "ZeroDivisionError" in out.stdout + out.stderr  # the rank's traceback
    assert job.state == "running"
    # an interrupt that reached a rank at its prompt, before it took the cell: the cell
    # is marked interrupted first, and the rank does not run it
    (job.dir.path / "session" / "5.interrupt").write_bytes(b"")
    out = kernel.execute("%%distributed --session i\nprint('ran anyway')\n")
    assert "interrupted" in out.error_text and "ran anyway" not in out.stdout, out.error_text
    assert job.state == "running"
    # a failure for the next cell from a holder of the job's secret, before the notebook
    # wrote it, is not rank 1's: refused, the cell runs (test_supervisor_rules has a
    # rank's own early failure interrupting the cell it names)
    forged = cell_done(ProcessId("worker", 1), next_index(job), "error", "Boom: early")
    assert job.request(forged)["ok"]
    out = kernel.execute("%%distributed --session i\nprint('ran', flush=True)\n")
    assert out.error is None and "Boom" not in out.error_text, out.error_text
    assert job.state == "running"
    # a rank that dies ends the session, with nothing left
    started = time.monotonic()
    out = kernel.execute(
        "%%distributed --session i\nimport os\n"
        "if os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n    os._exit(3)\n"
    )
    assert "exit code 3" in out.error_text + out.stdout + out.stderr, out.error_text
    assert time.monotonic() - started < 20
    wait_for(lambda: _gone(pids), 15, what="the session's processes to end")
    assert job.state == "failed"


def test_a_rank_that_ends_the_session_before_its_cell_is_announced_says_why(kernel, jobs_root):
    """The ranks take a cell from its file, so one that dies in it can end the session
    before the cell's request reaches the supervisor: the cell then says how the session
    ended (the rank's exit code), not that the request found it ended."""
    out = kernel.execute("%%distributed --session r --workers 2 --backend plain\nx = 0\n")
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))

    class Late(Job):  # the cell's request leaves once the session has ended
        def request(self, body, timeout=5.0):
            if body.get("op") == cell_request(0)["op"]:
                wait_for(lambda: self.done, 20, what="rank 1's exit to end the session")
            return super().request(body, timeout)

    code = "import os\nif os.environ['JUPYTER_DISTRAIN_RANK'] == '1':\n    os._exit(3)\n"
    run = CellRun.send(Late(job.dir), code, None, (False, False), None, False)
    with pytest.raises(JobFailed, match="exit code 3"):
        run.follow()


def test_a_ranks_forged_answers_are_refused_and_never_unpickled(kernel, jobs_root):
    """The audit's probes on local ranks: rank 1's cell answers for rank 0 (with --out),
    and pre-answers the next cell for both ranks."""
    out = kernel.execute("%%distributed --session f --workers 2 --backend plain\nx = 0\n")
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))
    check_forged_answers_are_refused(kernel, job, "f", jobs_root.parent / "unpickled")
    kernel.execute(f"%distributed stop {job.id}")


def test_32_ranks_send_back_every_result_of_a_cell(kernel, jobs_root):
    """--out-all from 32 ranks, each result near the inline limit (over 1 MiB in all:
    the size of one status reply when results rode in it, which then never ended)."""
    kernel.execute("import os\nos.environ['JUPYTER_DISTRAIN_LOCAL_PROCESS_LIMIT'] = '40'")
    out = kernel.execute("%%distributed --session big --workers 32 --backend plain\nx = 1\n")
    assert out.error is None, out.stderr + out.stdout[-3000:]
    job = Job(only_job(jobs_root))
    out = kernel.execute(
        "%%distributed --session big --out each --out-all\nimport os\n"
        "result = (int(os.environ['JUPYTER_DISTRAIN_RANK']), os.urandom(30_000))\n"
    )
    assert out.error is None, out.error_text + out.stdout[-3000:]
    said = kernel.execute("print([r for r, _ in each] == list(range(32)), len(each[31][1]))")
    assert said.stdout.strip() == "True 30000", said.stdout + said.stderr
    kernel.execute(f"%distributed stop {job.id}")
    assert job.state == "stopped"


def test_a_session_ends_with_its_kernel(kernel, new_kernel, jobs_root):
    other = new_kernel()
    out = other.execute("%%distributed --session k --workers 2 --backend plain\nx = 1\n")
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))
    pids = job_pids(job.dir)
    other.shutdown()
    wait_for(lambda: job.done, 15, what="the session to end with its kernel")
    assert job.state == "stopped"
    wait_for(lambda: _gone(pids), 15, what="the session's processes to end")


def test_a_kept_session_outlives_its_kernel_and_a_new_kernel_finds_it_by_name(
    kernel, new_kernel, jobs_root
):
    first = new_kernel()
    out = first.execute(
        "%%distributed --session kept --keep-session --workers 2 --backend plain\nx = 41\n"
    )
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))
    first.shutdown()
    time.sleep(2)  # the session's duty looks for its kernel every 0.5 s
    assert job.state == "running"
    out = kernel.execute("%%distributed --session kept --out y\nx += 1\nresult = x\n")
    assert out.error is None, out.stderr + out.stdout
    assert kernel.execute("print(y)").stdout.strip() == "42"
    kernel.execute("%distributed stop kept")
    assert job.state == "stopped"


def check_a_session_across(kernel, flags: str, jobs_root, node_dirs=None) -> Job:
    """A torch session on two hosts or nodes (``flags``: the launcher's): its cells reach
    ranks whose job directory is not the kernel's (relayed by their agents), results
    come back inline, an interrupt leaves it usable, forged answers are refused, Stop
    ends it. ``node_dirs``: the job's directories on nodes where pushed values stay in
    memory (Ray, Slurm): no file of them holds a value pushed to a later cell, and
    nothing of it is left in memory after the stop. Returns the job."""
    out = kernel.execute(TORCH_SESSION.replace("--backend torch", f"--backend torch {flags}"))
    assert out.error is None, out.error_text + out.stdout[-3000:]
    job = Job(only_job(jobs_root))
    out = kernel.execute(
        "%%distributed --session s --out weights --out-all\n"
        "import os\nlast = train(10)\n"
        "result = (os.environ['JUPYTER_DISTRAIN_ADDRESS'],\n"
        "          [p.detach().clone() for p in model.parameters()])\n"
    )
    assert out.error is None, out.error_text + out.stdout[-3000:]
    out = kernel.execute(
        "import torch\nprint(len({a for a, _ in weights}), "
        "all(torch.equal(a, b) for a, b in zip(weights[0][1], weights[1][1])))"
    )
    assert out.stdout.strip() == "2 True", out.stdout + out.stderr
    asleep = kernel.submit(
        "%%distributed --session s\nimport time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
    )
    wait_for(lambda: job.logs().count("sleeping") == 2, 60, what="both ranks asleep")
    kernel.km.interrupt_kernel()
    out = kernel.collect(asleep, timeout=60)
    assert "interrupted" in out.error_text, out.error_text + out.stdout
    out = kernel.execute("%%distributed --session s --out again\nresult = train(2)\n")
    assert out.error is None, out.error_text + out.stdout[-3000:]
    check_forged_answers_are_refused(kernel, job, "s", jobs_root.parent / "unpickled")
    if node_dirs is not None:
        kernel.execute("pushed = 'pushed-7f3a9c'")
        out = kernel.execute(
            "%%distributed --session s --push pushed --out seen\nresult = pushed\n"
        )
        assert out.error is None, out.error_text + out.stdout[-3000:]
        assert kernel.execute("print(seen)").stdout.strip() == "pushed-7f3a9c"
        found = [
            path for path in files_of(node_dirs(job.id)) if b"pushed-7f3a9c" in path.read_bytes()
        ]
        assert found == [], found
    kernel.execute(f"%distributed stop {job.id}")
    assert job.state == "stopped"
    if node_dirs is not None:
        wait_for(lambda: list(MEMORY.glob("jupyter_distrain-cells-*")) == [], 30, what="memory")
    return job


MEMORY = Path("/dev/shm")


def files_of(directories) -> list[Path]:
    """The regular files under ``directories``, links not followed."""
    found = []
    for directory in directories:
        for root, _, names in os.walk(directory):
            found += [Path(root, n) for n in names if Path(root, n).is_file()]
    return [p for p in found if not p.is_symlink()]


def test_a_rank_stuck_in_a_collective_after_an_interrupt_ends_the_session_with_its_stack(
    kernel, jobs_root
):
    out = kernel.execute(TORCH_SESSION)
    assert out.error is None, out.stderr + out.stdout
    job = Job(only_job(jobs_root))
    pids = job_pids(job.dir)
    msg = kernel.submit(
        "%%distributed --session s\nimport time\nprint('in', flush=True)\n"
        "if rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(600)\n"
    )
    wait_for(lambda: _logs_saying(job, "in") == 2, 30, what="both ranks in the cell")
    time.sleep(0.5)  # rank 0 inside the barrier
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg, timeout=60)
    said = out.error_text + out.stdout + out.stderr
    assert "rank 0 did not come back to the prompt" in said, said
    assert "barrier" in said  # where it is stuck: its stack
    wait_for(lambda: _gone(pids), 15, what="the session's processes to end")
    assert job.state == "failed"


def check_backend_session(
    kernel, jobs_root, backend: str, start: str, reduce: str, flags: str = ""
) -> Job:
    """A session on ``backend`` (``flags``: a launcher's): ``start`` initialises it in the
    first cell as a job's program would (no arguments); a later cell's ``reduce`` binds
    ``result`` to the ranks' ``rank + 1`` summed across both ranks, by the backend's own
    collective; an interrupt leaves it usable (the collective works after it); Stop ends
    it with nothing left. Returns the job."""
    line = f"%%distributed --session b --workers 2 --backend {backend} {flags}"
    out = kernel.execute(f"{line}\n{start}")
    assert out.error is None, out.error_text + out.stdout[-3000:]
    job = Job(only_job(jobs_root))
    reducing = (
        "%%distributed --session b --out summed --out-all\n"
        "import os\nrank = int(os.environ['JUPYTER_DISTRAIN_RANK'])\n" + reduce
    )
    for _ in range(2):
        out = kernel.execute(reducing)
        assert out.error is None, out.error_text + out.stdout[-3000:]
        assert kernel.execute("print(summed)").stdout.strip() == "[3, 3]"
        if _logs_saying(job, "sleeping") == 0:
            asleep = kernel.submit(
                "%%distributed --session b\nimport time\nprint('sleeping', flush=True)\n"
                "time.sleep(600)\n"
            )
            wait_for(lambda: _logs_saying(job, "sleeping") == 2, 60, what="both ranks asleep")
            kernel.km.interrupt_kernel()
            out = kernel.collect(asleep, timeout=60)
            assert "interrupted" in out.error_text, out.error_text + out.stdout
    pids = job_pids(job.dir)
    kernel.execute(f"%distributed stop {job.id}")
    wait_for(lambda: _gone(pids), 15, what="the session's processes to end")
    return job


@pytest.mark.horovod
def test_a_horovod_session_allreduces_across_cells(kernel, jobs_root):
    check_backend_session(
        kernel,
        jobs_root,
        "horovod",
        "import horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n",
        "result = int(hvd.allreduce(tf.constant(rank + 1), op=hvd.Sum))\n",
    )
