"""``--backend torch`` with real PyTorch (CPU, Gloo): two ranks on different data end with
identical weights, as the same file does under ``torchrun``; the widget's steps come
from the optimizer with no code change; a crashing rank fails the job fast with its
traceback while the other waits in a collective; a port scan from another host finds
nothing of a local job, whose Stop leaves nothing; bad input is one line."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    TORCH_STACKS_PROGRAM,
    check_torch_stacks,
    checkpointed_ddp,
    failed_seconds_after_exit,
    fault_row,
    refusals_without,
    running,
    wait_for,
)
from jobscan import left_after, processes_of
from netprobe import listening_sockets, other_host_namespace, port_open
from test_pool import _ready_pool, pool_on  # noqa: F401  (pool_on: a fixture)

from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.store import list_job_dirs

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

DDP_PROGRAM = """\
import hashlib, os
import torch, torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)  # one summation order: the same weights as under torchrun
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
shard = torch.utils.data.TensorDataset(x[rank::world], y[rank::world])  # its own data
loader = torch.utils.data.DataLoader(shard, batch_size=32)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
model = DistributedDataParallel(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
for epoch in range(4):
    for xb, yb in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
accuracy = (model(x).argmax(1) == y).float().mean().item()
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
env = " ".join(f"{k}={os.environ[k]}" for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"))
print(f"rank {rank} world {world} {env} master {os.environ['MASTER_ADDR']} "
      f"weights {hashlib.sha256(weights).hexdigest()[:16]} accuracy {accuracy:.3f}", flush=True)
dist.destroy_process_group()
"""
SAID = re.compile(r"rank (\d) world (\d) (.*) master (\S+) weights (\w+) accuracy ([\d.]+)")
STEPS_PER_RANK = 4 * 29  # 4 epochs of ceil(899 / 32) batches


def said(text: str) -> re.Match[str]:
    found = SAID.search(text)
    assert found, text
    return found


def test_two_ranks_on_different_data_end_with_the_weights_torchrun_gives(jobs_root, tmp_path):
    job = submit(JobSpec(code=DDP_PROGRAM, workers=2))
    assert job.spec.backend == "torch"  # auto: the cell imports torch and not TensorFlow
    assert job.backend_reason.startswith("the cell imports torch and not TensorFlow")
    assert job.wait(240) == "succeeded", job.status().error
    ranks = [said(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert [m.group(1, 2) for m in ranks] == [("0", "2"), ("1", "2")]
    assert [m.group(3) for m in ranks] == [
        "LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=0",
        "LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=0",
    ]
    assert {m.group(4) for m in ranks} == {"127.0.0.1"}  # inside the job's namespace
    # no word from our own sandbox: c10d's reverse lookup of its peer gets an answer there
    assert "[c10d]" not in job.logs(), job.logs()
    assert ranks[0].group(5) == ranks[1].group(5)  # identical weights
    assert float(ranks[0].group(6)) > 0.8
    # the widget's steps: one per optimizer.step(), 32 images each, per rank, no code change
    records = [json.loads(line) for line in job.dir.metrics_file.read_text().splitlines()]
    for index in (0, 1):
        steps = [r for r in records if r["index"] == index and "step" in r]
        assert [r["step"] for r in steps] == list(range(1, STEPS_PER_RANK + 1))
        assert steps[0]["images"] == 32 and all(r["images_per_sec"] > 0 for r in steps[1:])
    # the same file under torchrun gives the same weights
    program = tmp_path / "train.py"
    program.write_text(DDP_PROGRAM)
    torchrun = Path(sys.executable).with_name("torchrun")
    for _ in range(2):  # the reference itself: once in a full run, torchrun's rank 0
        # aborted in Gloo (SIGABRT, outside our code); a second try then passed
        run = subprocess.run(
            [str(torchrun), "--standalone", "--nproc-per-node", "2", str(program)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        if "Signal 6 (SIGABRT)" not in run.stderr:
            break
    assert run.returncode == 0, run.stderr[-2000:]
    by_torchrun = {m.group(5) for m in SAID.finditer(run.stdout)}
    assert by_torchrun == {ranks[0].group(5)}


CRASHING = """\
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(0.5)
    raise ValueError("bad batch on rank one")
dist.all_reduce(torch.ones(1))  # rank 0 waits here for a rank that is gone
time.sleep(120)
"""


LATE_MASTER = """\
import os, time
import torch.distributed as dist
rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(1.0)  # rank 1 asks for the store first: refused
    print(f"listening at {time.time():.3f}", flush=True)
dist.init_process_group("gloo")
if rank == 1:
    print(f"joined at {time.time():.3f}", flush=True)
dist.destroy_process_group()
"""


def test_a_rank_that_asks_for_the_store_first_joins_as_soon_as_rank_0_listens(jobs_root):
    """torch's store client backs off (about half a second, with jitter) once refused;
    the worker has init_process_group wait for rank 0's store instead (a cold job's
    ranks reached their first step 0.5 s later before)."""
    job = submit(JobSpec(code=LATE_MASTER, workers=2, backend="torch"))
    assert job.wait(120) == "succeeded", job.status().error
    listening = float(re.search(r"listening at ([\d.]+)", job.logs(ProcessId("worker", 0)))[1])
    joined = float(re.search(r"joined at ([\d.]+)", job.logs(ProcessId("worker", 1)))[1])
    assert 0 < joined - listening < 0.3


FAULTING_STEPS = """\
import resource
import torch
torch.ones(1 << 20).sum()  # (the first allocations are faults anyway)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):  # a step's activations: 10 MiB made, used, freed
    activations = [torch.empty(1 << 18).fill_(1.0) for _ in range(10)]
    del activations
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, flush=True)
"""


def test_a_torch_rank_keeps_a_steps_freed_memory_for_the_next_unless_told(jobs_root):
    """glibc gave a step's freed 10 MiB back to the kernel and the next step faulted its
    2,560 pages in again (~500,000 faults for 200 steps; 15-35% of a small model's
    step time, and what made pooled ranks slower than cold ones): a torch rank keeps it
    (worker/allocator.py); a MALLOC_ variable of the user's leaves glibc as it is."""

    def faults(**env) -> int:
        job = submit(JobSpec(code=FAULTING_STEPS, workers=1, backend="torch", env=env))
        assert job.wait(120) == "succeeded", job.status().error
        return int(re.search(r"faults (\d+)", job.logs(ProcessId("worker", 0)))[1])

    assert faults() < 10_000
    assert faults(MALLOC_TRIM_THRESHOLD_="131072") > 100_000


def test_a_crashing_rank_fails_the_job_fast_with_its_traceback(jobs_root):
    job = submit(JobSpec(code=CRASHING, workers=2, backend="torch", grace=2))
    wait_for(lambda: job.done, 120, what="the job to end")
    status = job.status()
    assert status.state == "failed"
    assert status.error.startswith("rank 1 failed first"), status.error
    assert "ValueError: bad batch on rank one" in job.logs(ProcessId("worker", 1))
    assert failed_seconds_after_exit(job.dir) < 2.0
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


HANGING = """\
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()  # DDP's allreduce: a collective every step
    optimizer.step()
if dist.get_rank() == 1:
    time.sleep(600)  # hangs; rank 0 waits for it in the next step's allreduce
model(torch.ones(8, 4)).sum().backward()
"""


def test_a_rank_hanging_in_a_collective_is_named_by_the_stall_warning_with_the_stacks(jobs_root):
    """The stall's warning says where each rank stands: rank 1 in its sleep, rank 0 in
    the next step's backward (DDP's allreduce); the stacks are kept with the logs."""
    job = submit(JobSpec(code=HANGING, workers=2, backend="torch", stall_timeout=3, grace=1))
    wait_for(lambda: job.status().warnings or job.done, 120, what="the stall warning")
    (warning,) = job.status().warnings
    head, *stacks = warning.splitlines()
    assert head.startswith("training stalled: no step since"), warning
    assert "at step 5" in head and "rank 0" in head and "rank 1" in head, warning
    (rank0,) = [line for line in stacks if line.startswith("  rank 0: ")]
    assert rank0.endswith("← train.py:12  model(torch.ones(8, 4)).sum().backward()"), warning
    (rank1,) = [line for line in stacks if line.startswith("  rank 1: ")]
    assert rank1.startswith("  rank 1: train.py:11 in <module>  time.sleep(600)"), warning
    assert [r.reason for r in job.kept_stacks()] == ["stall"]
    assert job.stop() == "stopped"  # both, the one in the collective included
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_the_stacks_of_a_ddp_job_show_rank_1_loading_and_the_others_in_all_reduce(jobs_root):
    job = submit(JobSpec(code=TORCH_STACKS_PROGRAM, workers=3, backend="torch", grace=1))
    check_torch_stacks(job, 3)
    assert job.stop() == "stopped"
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


WAITING = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("up", flush=True)
time.sleep(600)
"""


@pytest.mark.root  # a second host (network namespace)
def test_a_port_scan_from_another_host_finds_nothing_of_a_local_torch_job(jobs_root):
    job = submit(JobSpec(code=WAITING, workers=2, backend="torch", grace=1))
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in (0, 1)]
    up = lambda: all(log.exists() and "up" in log.read_text() for log in logs)  # noqa: E731
    wait_for(up, 120, what="both ranks up")
    master = job.status().backend_info["master"]
    store_port = int(master.rpartition(":")[2])
    processes = processes_of(job.dir.path)
    ports = {port for p in processes for _, port in listening_sockets(p.pid)}
    assert store_port in ports  # rank 0 serves the TCPStore (Gloo listens too)
    with other_host_namespace() as (namespace, address):
        reachable = [p for p in sorted(ports) if port_open(namespace, address, p)]
    assert job.stop() == "stopped"
    left = left_after(lambda: processes_of(job.dir.path), 10)
    fault_row("port scan (torch job: TCPStore, Gloo)", not reachable, job.state, len(left))
    assert reachable == [] and left == []


def test_parameter_servers_with_torch_are_one_line_and_launch_nothing(jobs_root):
    with pytest.raises(SpecError, match=r"^--ps is for the parameter-server backend"):
        submit(JobSpec(code="import torch\n", workers=2, ps=2, backend="torch"))
    assert list(jobs_root.iterdir()) == []


def test_without_torch_the_backend_is_one_line_naming_the_install(jobs_root):
    lines = refusals_without("torch")
    assert len(lines) == 2, lines
    assert lines[0].startswith("--backend torch: torch is not installed: pip install")
    assert lines[1].startswith("--backend auto: the cell imports torch, but torch is not")
    assert list(jobs_root.iterdir()) == []


SCALABLE = """\
import time
import torch, torch.distributed as dist
import jupyter_distrain.torch as jdt
jdt.setup()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
WRAP
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
state = jdt.checkpointed(model=model, optimizer=optimizer, step=0)
local = sum(getattr(p, "to_local", lambda: p)().numel() for p in model.parameters())
total = sum(p.numel() for p in model.parameters())
torch.manual_seed(1)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
first = torch.nn.functional.mse_loss(model(x), y).item()
print(f"start at step {state.step} world {dist.get_world_size()} loss {first:.4f} "
      f"holds {local} of {total}", flush=True)
while True:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    state.step += 1
    if state.step % 10 == 0:
        print(f"step {state.step}", flush=True)
    time.sleep(0.02)
    state.save_if_asked()
"""
WRAPS = {
    "ddp": "model = torch.nn.parallel.DistributedDataParallel(model)",
    "fsdp": (  # FSDP2: each Linear's parameters sharded across the ranks, then the root
        "from torch.distributed.fsdp import fully_shard\n"
        "for layer in model[0], model[2]:\n"
        "    fully_shard(layer)\n"
        "fully_shard(model)"
    ),
}
START = re.compile(r"start at step (\d+) world (\d) loss ([\d.]+) holds (\d+) of (\d+)")


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_scale_2_to_3_resumes_at_the_same_global_step_from_the_checkpoint(jobs_root, wrap):
    """``jupyter_distrain.torch.checkpointed``: the scale saves model and optimizer with
    torch.distributed.checkpoint at one step on every rank; the three ranks of the next
    generation load it and go on from that step, with the loss where it was. With FSDP2
    (``fully_shard``) each rank holds a shard, and the shards are re-cut for three."""
    code = SCALABLE.replace("WRAP", WRAPS[wrap])
    job = submit(JobSpec(code=code, workers=2, backend="torch", grace=2))
    log = job.dir.log_file(ProcessId("worker", 0))
    wait_for(lambda: log.exists() and "step 30\n" in log.read_text(), 120, what="step 30")
    job.scale(3)
    wait_for(lambda: job.status().generation == 1 and job.state == "running", 120, what="restart")
    logs = [job.dir.log_file(ProcessId("worker", i)) for i in range(3)]
    started = lambda: [START.findall(p.read_text()) if p.exists() else [] for p in logs]  # noqa: E731
    wait_for(
        lambda: all(len(s) == (2 if i < 2 else 1) for i, s in enumerate(started())),
        120,
        what="the three ranks of the next generation",
    )
    runs = started()
    assert [r[0][:2] for r in runs[:2]] == [("0", "2"), ("0", "2")]  # generation 0: fresh
    resumed = {run[-1][:2] for run in runs}
    assert len(resumed) == 1  # one step, world 3 on every rank
    step, world = resumed.pop()
    assert world == "3" and int(step) >= 30
    assert float(runs[0][-1][2]) < float(runs[0][0][2]) / 4  # the loss went on, not reset
    for generation, size in ((0, 2), (-1, 3)):
        held = [int(run[generation][3]) for run in runs[:size]]
        total = int(runs[0][0][4])
        if wrap == "fsdp":
            assert sum(held) == total and max(held) < total, held  # sharded
        else:
            assert held == [total] * size  # replicated

    def rank_2_steps() -> list[int]:
        records = map(json.loads, job.dir.metrics_file.read_text().splitlines())
        return [r["step"] for r in records if r.get("index") == 2 and "step" in r]

    wait_for(rank_2_steps, 30, what="rank 2's steps")
    assert rank_2_steps()[0] == int(step) + 1  # the widget's steps go on from there too
    assert job.stop() == "stopped"
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


RESTARTING = checkpointed_ddp(
    30,
    # the first generation only (it did not resume): a marker file on rank 1's host would
    # not come back to it (only rank 0's host's checkpoints do)
    "if state.step == 23 and dist.get_rank() == 1 and not state.resumed:\n"
    '    raise RuntimeError("rank 1 lost at step 23")',
    'print("ended at step", state.step, flush=True)',
)


def test_a_restart_resumes_from_the_last_periodic_checkpoint(jobs_root):
    """``--max-restarts 1 --checkpoint-every 5``: rank 1 dies at step 23 of the first
    generation; the second resumes from the checkpoint of step 20 (said in the log) and
    ends at step 30; the failure's traceback stays in rank 1's log."""
    spec = JobSpec(
        code=RESTARTING, workers=2, backend="torch", max_restarts=1, checkpoint_every="5", grace=2
    )
    job = submit(spec)
    assert job.wait(180) == "succeeded", job.status().error
    status = job.status()
    assert (status.restarts, status.generation) == (1, 1)
    (said,) = [w for w in status.warnings if w.startswith("restart ")]
    assert said.startswith("restart 1 of 1 after rank 1 failed first (exit code 1)"), said
    log0 = job.logs(ProcessId("worker", 0))
    assert "jupyter_distrain: resumed from the checkpoint of step 20" in log0, log0
    assert log0.rstrip().endswith("ended at step 30"), log0
    assert "RuntimeError: rank 1 lost at step 23" in job.logs(ProcessId("worker", 1))
    assert sorted(p.name for p in job.dir.checkpoints_dir.iterdir()) == ["torch-state"]
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


COMPILED = """\
import torch
from torch._dynamo.utils import counters
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()))
model(torch.ones(4, 8)).sum().backward()
inductor = counters["inductor"]
print("graphs reused", inductor["fxgraph_cache_hit"], "compiled", inductor["fxgraph_cache_miss"])
"""


def test_torch_compile_in_a_rerun_reuses_the_graphs_the_last_run_compiled(jobs_root, tmp_path):
    """Inductor's caches are in the user's cache directory, not in the job's temporary
    directory, which goes with the job (``worker/compile_cache.py``): before, every run
    compiled everything again."""
    cache = tmp_path / "cache"
    said = []
    for _ in range(2):
        job = submit(JobSpec(code=COMPILED, workers=1, env={"XDG_CACHE_HOME": str(cache)}))
        assert job.wait(300) == "succeeded", job.status().error
        counts = re.search(r"graphs reused (\d+) compiled (\d+)", job.logs(ProcessId("worker", 0)))
        assert counts, job.logs()
        said.append((int(counts[1]), int(counts[2])))
    (first_reused, first_compiled), (reused, compiled) = said
    assert first_reused == 0 and first_compiled > 0, said
    assert (reused, compiled) == (first_compiled, 0), said
    (kept,) = (cache / "jupyter_distrain" / "torchinductor").iterdir()
    assert kept.stat().st_mode & 0o777 == 0o700 and any(kept.iterdir())


def test_bench_runs_torch_on_the_same_resnet_and_says_its_framework(jobs_root):
    from jupyter_distrain.client import bench

    tiny = {"image_size": 8, "width": 4, "blocks": 1, "batch_size": 8, "steps": 5, "epochs": 2}
    settings = bench.BenchSettings(workers=2, backends=["torch"], **tiny)
    rows, _ = bench.run(settings, progress=lambda line: None)
    assert sorted((r.backend, r.framework, r.workers) for r in rows) == [
        ("torch", "PyTorch", 1),
        ("torch", "PyTorch", 2),
    ]
    assert all(r.images_per_sec > 0 for r in rows)
    lines = bench.table(rows).splitlines()
    assert lines[1].split()[:3] == ["torch", "PyTorch", "1"]


@pytest.mark.usefixtures("pool_on")
def test_a_rerun_takes_warm_torch_processes_and_trains_the_same():
    """The torch pool kind: processes with torch imported and nothing initialised; the
    second run's ranks are claimed from it and train to the same weights."""
    first = submit(JobSpec(code=DDP_PROGRAM, workers=2, backend="torch"))
    assert first.wait(240) == "succeeded", first.status().error
    assert [p.pooled for p in first.status().processes] == [False, False]
    idle = _ready_pool().idle
    asks = 'import sys; print("dynamo imported:", "torch._dynamo" in sys.modules)\n'
    second = submit(JobSpec(code=asks + DDP_PROGRAM, workers=2, backend="torch"))
    assert second.wait(240) == "succeeded", second.status().error
    rows = second.status().processes
    assert [p.pooled for p in rows] == [True, True]
    assert sorted(p.pid for p in rows) == sorted(idle)
    for rank in (0, 1):
        assert "dynamo imported: True" in second.logs(ProcessId("worker", rank))
    weights = {
        said(job.logs(ProcessId("worker", i))).group(5) for job in (first, second) for i in (0, 1)
    }
    assert len(weights) == 1


@pytest.mark.usefixtures("pool_on")
def test_warm_runs_of_the_launch_benchmark_program_all_end():
    """The launch benchmark's DDP program, run after run from the pool: every run ends.
    With torch 2.13 the process group's destructor, run as the program's namespace
    was freed, waited with the GIL held for a Gloo thread that waited for the GIL (4
    of 10 such runs hung before the worker let those threads have it)."""
    found = importlib.util.spec_from_file_location("bench", BENCHMARKS / "launch_overhead.py")
    assert found is not None and found.loader is not None
    bench_module = importlib.util.module_from_spec(found)
    found.loader.exec_module(bench_module)
    code = bench_module.TORCH_SCRIPT.format(steps=300)
    pooled = []
    for _ in range(5):
        job = submit(JobSpec(code=code, workers=2, backend="torch"))
        try:
            assert job.wait(60) == "succeeded", job.status().error
        except TimeoutError:
            pytest.fail(f"{job.id} hung: {job.status().processes}")
        finally:
            job.stop()
        pooled.append(all(p.pooled for p in job.status().processes))
        _ready_pool()
    assert pooled[1:] == [True] * 4


def test_the_pytorch_notebook_trains_scales_shards_and_averages(jobs_root):
    """notebooks/08-pytorch.ipynb as `make demo` runs a notebook: DDP, a scale 2 -> 3
    from the checkpoint, FSDP and the seed's mpi4py model averaging."""
    from test_notebook import _run

    cells = _run("08-pytorch", jobs_root)
    weights = re.findall(
        r"^\[(\d)\] rank \d of 2: test accuracy [\d.]+, weights (\w+)$", cells[1], re.M
    )
    assert len(weights) == 2 and weights[0][1] == weights[1][1], cells[1]
    assert float(re.search(r"DDP on 2 ranks: test accuracy ([\d.]+)", cells[2]).group(1)) > 0.8
    assert "scaling to 3 workers" in cells[4]
    assert "succeeded: 3 workers, generation 1" in cells[5]
    resumed = re.search(r"generation 1 started at step (\d+) with 3 ranks", cells[5])
    assert resumed and int(resumed.group(1)) >= 100, cells[5]
    held = [int(n) for n in re.findall(r"holds (\d+) of 4810 parameters", cells[6])]
    assert sorted(held) == [2405, 2405], cells[6]  # each rank holds half of the model
    assert float(re.search(r"FSDP test accuracy: ([\d.]+)", cells[7]).group(1)) > 0.8
    averaged = re.findall(r"worker \d of 2: test accuracy ([\d.]+)", cells[8])
    assert len(averaged) == 2 and len(set(averaged)) == 1 and float(averaged[0]) > 0.8


def ddp_rerun_from_the_pool(spec: JobSpec, monkeypatch, ready) -> Job:
    """With pools on: ``spec`` (the DDP program) run twice: the first cold, the second
    (once ``ready()``: the pools the first started have imported; on 2 busy cores that
    can outlast the 8 s a claim waits) with its ranks taken from the pool, ending with
    identical weights. Returns the second job."""
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL", "1")
    monkeypatch.setenv("JUPYTER_DISTRAIN_POOL_IDLE", "60")
    first = submit(spec)
    assert first.wait(240) == "succeeded", first.status().error
    assert [p.pooled for p in first.status().processes] == [False, False]
    wait_for(ready, 60, 0.5, what="the pools the first run started")
    second = submit(spec)
    assert second.wait(240) == "succeeded", second.status().error
    assert [p.pooled for p in second.status().processes] == [True, True]
    said = [SAID.search(second.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), second.logs()
    assert said[0].group(5) == said[1].group(5)  # identical weights
    return second


def test_the_gpu_check_runs_its_pytorch_job_where_no_gpu_is_lent(jobs_root):
    """benchmarks/gpu_check.py runs on a GPU machine only when a session is lent one:
    its --cpu mode runs the same PyTorch job here so that it still works then."""
    check = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--cpu", "--frameworks", "torch"]
        + ["--steps", "5", "--batch", "8"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "torch: job" in check.stdout and "succeeded" in check.stdout, check.stdout
    assert "weights agree across 2 ranks: True" in check.stdout, check.stdout


def test_the_sessions_notebook_trains_one_model_over_cells_and_stops(jobs_root):
    """notebooks/09-sessions.ipynb as `make demo` runs a notebook: a DDP model built in one
    cell, trained in the next, per-rank losses inspected, the learning rate pushed and
    trained again, all in one session's ranks; then stopped by its name."""
    from test_notebook import _run

    cells = _run("09-sessions", jobs_root)
    assert "[0] rank 0 of 2: 720 digits, model ready" in cells[1]
    epoch = re.findall(r"^\[(\d)\] epoch 1: loss [\d.]+, weights (\w+)$", cells[2], re.M)
    assert len(epoch) == 2 and epoch[0][1] == epoch[1][1], cells[2]  # DDP: the same weights
    assert len(re.findall(r"^rank \d: mean loss [\d.]+ over its shard$", cells[3], re.M)) == 2
    again = re.findall(
        r"^\[(\d)\] lr 0.1: loss ([\d.]+) -> ([\d.]+), weights (\w+)$", cells[5], re.M
    )
    assert len(again) == 2 and again[0][3] == again[1][3] != epoch[0][1], cells[5]
    assert all(float(last) < float(first) for _, first, last, _ in again)
    assert float(re.search(r"test accuracy ([\d.]+)", cells[6]).group(1)) > 0.8
    assert "session digits" in cells[7] and "stopped." in cells[7]
    (job,) = [Job(d) for d in list_job_dirs(jobs_root)]
    assert job.state == "stopped"
    pids = job.pids()  # its ranks, its warden and its supervisor, which ends after its state
    wait_for(lambda: not any(running(p) for p in pids), 15, what="the session's processes to end")
