"""``--backend mpi``: an mpi4py program under one ``mpirun``, with the seed's own
model-averaging loop (each rank computes the gradient on its share of the batch, an
``Allreduce`` averages them): both ranks end with the same weights, each rank has its
own row and log, a failing rank fails the job with its traceback, bad input is one line.
Across two ssh hosts: tests/test_ssh.py."""

from __future__ import annotations

import re

import pytest
from conftest import STACKS_PROGRAM, check_stacks_of_the_odd_rank
from jobscan import left_after, processes_of
from test_session import check_backend_session

from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.client.job import JobFailed
from jupyter_distrain.contract.process import ProcessId

AVERAGING = """\
import hashlib
import numpy as np
from mpi4py import MPI
from sklearn.datasets import load_digits
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x, y = load_digits(return_X_y=True)
x, target = x / 16, np.eye(10)[y]
mine = slice(rank, None, size)  # this rank's share of every batch
w = np.zeros((64, 10))
for step in range(60):
    logits = x[mine] @ w
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = x[mine].T @ (p - target[mine]) / len(p)
    total = np.empty_like(grad)
    comm.Allreduce(grad, total, op=MPI.SUM)
    w -= 1.0 * total / size
accuracy = ((x @ w).argmax(1) == y).mean()
digest = hashlib.sha256(w.tobytes()).hexdigest()[:16]
print(f"rank {rank} size {size} weights {digest} accuracy {accuracy:.3f}", flush=True)
"""
SAID = re.compile(r"rank (\d) size (\d) weights (\w+) accuracy ([\d.]+)")


def test_an_mpi4py_allreduce_averages_the_gradients_of_two_ranks(jobs_root):
    job = submit(JobSpec(code=AVERAGING, workers=2))
    assert job.spec.backend == "mpi"  # auto: the cell imports mpi4py and not TensorFlow
    assert job.wait(120) == "succeeded", job.status().error
    said = [SAID.search(job.logs(ProcessId("worker", i))) for i in (0, 1)]
    assert all(said), job.logs()
    assert [m.group(1, 2) for m in said] == [("0", "2"), ("1", "2")]
    assert said[0].group(3) == said[1].group(3)  # the same weights on both ranks
    assert float(said[0].group(4)) > 0.85
    rows = {str(p.id) for p in job.status().processes}
    assert {"worker-0", "worker-1"} <= rows
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


FAILING = """\
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.Get_rank() == 1:
    raise ValueError("bad shard on rank one")
comm.Barrier()  # rank 0 waits for a rank that is gone
time.sleep(120)
"""


def test_a_failing_mpi_rank_fails_the_job_with_its_traceback(jobs_root):
    job = submit(JobSpec(code=FAILING, workers=2, backend="mpi", grace=2))
    with pytest.raises(JobFailed, match="rank 1 failed first"):
        job.wait(60)
    assert "ValueError: bad shard on rank one" in job.logs(ProcessId("worker", 1))
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_the_stacks_of_mpirun_s_ranks_show_where_each_stands(jobs_root):
    job = submit(JobSpec(code=STACKS_PROGRAM, workers=3, backend="mpi", grace=1))
    check_stacks_of_the_odd_rank(job, 3)
    assert job.stop() == "stopped"
    assert left_after(lambda: processes_of(job.dir.path), 10) == []


def test_mpi_on_ray_is_one_line_and_launches_nothing(jobs_root):
    with pytest.raises(SpecError, match=r"^--backend mpi is not supported by --launcher ray"):
        submit(JobSpec(code="from mpi4py import MPI\n", workers=2, launcher="ray"))
    assert list(jobs_root.iterdir()) == []


MPI_SESSION = (
    "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\n",
    "result = comm.allreduce(rank + 1)\n",
)


def test_an_mpi_session_reduces_across_cells_and_survives_an_interrupt(kernel, jobs_root):
    """mpirun's ranks run the cells: SIGINT reaches each rank (adopted by its hello), not
    mpirun (which would end them all)."""
    check_backend_session(kernel, jobs_root, "mpi", *MPI_SESSION)
