"""Real Horovod jobs launched from a real kernel: Gloo and MPI controllers."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.horovod  # needs Horovod: not run on current TensorFlow

ALLREDUCE = """\
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
print(f"rank {hvd.rank()} size {hvd.size()} sum {float(total)}")
"""


def _ranks_report(stdout: str) -> dict[int, tuple[int, float]]:
    found = re.findall(r"^\[(\d)\] rank (\d) size (\d) sum ([\d.]+)$", stdout, re.M)
    return {int(rank): (int(size), float(s)) for label, rank, size, s in found if label == rank}


def test_allreduce_on_two_gloo_workers(kernel):
    out = kernel.execute("%%distributed --workers 2\n" + ALLREDUCE)
    assert out.error is None, out.error_text + out.stdout
    assert _ranks_report(out.stdout) == {0: (2, 3.0), 1: (2, 3.0)}


def test_mpi_controller_gives_mpi4py_and_horovod(kernel):
    cell = (
        "%%distributed --workers 2 --controller mpi\n"
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "print(f'mpi {comm.Get_rank()} of {comm.Get_size()} gathered {comm.allgather(comm.Get_rank())}')\n"
        + ALLREDUCE
    )
    out = kernel.execute(cell)
    assert out.error is None, out.error_text + out.stdout
    assert "[0] mpi 0 of 2 gathered [0, 1]" in out.stdout
    assert "[1] mpi 1 of 2 gathered [0, 1]" in out.stdout
    assert _ranks_report(out.stdout) == {0: (2, 3.0), 1: (2, 3.0)}


def test_push_and_out_round_trip(kernel):
    out = kernel.execute("weights = {'a': 1.5, 'b': [1, 2]}\nscale = lambda x: x * 10")
    assert out.error is None
    cell = (
        "%%distributed --workers 2 --push weights,scale --out answer\n"
        "import horovod.tensorflow as hvd\n"
        "hvd.init()\n"
        "result = {'rank': hvd.rank(), 'scaled': scale(weights['a']), 'b': weights['b']}\n"
    )
    out = kernel.execute(cell)
    assert out.error is None, out.error_text + out.stdout
    out = kernel.execute("print(answer)")
    assert out.stdout.strip() == "{'rank': 0, 'scaled': 15.0, 'b': [1, 2]}"
