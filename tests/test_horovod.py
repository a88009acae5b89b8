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


KERAS_CONVERSIONS = """\
import numpy as np, tensorflow as tf, horovod.tensorflow.keras as hvd
from tensorflow.python.autograph.impl import api
hvd.init()
x = np.random.default_rng(0).random((256, 8), dtype=np.float32); y = (x.sum(1) > 4).astype("int32")
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
codes = [c for c in api._TRANSPILER._cache._cache if hasattr(c, "co_filename")]
helpers = sorted({c.co_name for c in codes if "/horovod/" in c.co_filename})
kernels = hvd.allgather(tf.constant(model.layers[0].kernel.numpy()[None])).numpy()
same = kernels[0] == kernels[1]
print(f"horovod converted {','.join(helpers) or '-'} keras converted "
      f"{sum('/keras/' in c.co_filename for c in codes)} in step {bool(same.all())} "
      f"traced {model.train_function.experimental_get_tracing_count()}", flush=True)
"""


@pytest.mark.parametrize("autograph, horovod_converted", [("", False), ("1", True)])
def test_autograph_leaves_horovods_code_alone_unless_asked(
    kernel, autograph: str, horovod_converted: bool
):
    """Converting Horovod's helpers, and the bodies of its ``tf.function``s, was most of
    a rank's first step; the replicas train in step without it.
    ``JUPYTER_DISTRAIN_HOROVOD_AUTOGRAPH=1`` converts them again."""
    env = f" --env JUPYTER_DISTRAIN_HOROVOD_AUTOGRAPH={autograph}" if autograph else ""
    out = kernel.execute(f"%%distributed --workers 2{env}\n" + KERAS_CONVERSIONS)
    assert out.error is None, out.error_text + out.stdout
    found = re.findall(
        r"^\[\d\] horovod converted (\S+) keras converted (\d+) in step (\w+) traced (\d+)$",
        out.stdout,
        re.M,
    )
    assert len(found) == 2, out.stdout
    for horovod, keras, in_step, traced in found:
        # Horovod's allreduce helper, called inside Keras's train step, and the bodies
        # of its tf.functions (the optimizer's allreduce, the callback's broadcast)
        helpers = set(horovod.split(","))
        expected = {"_allreduce", "allreduce_grads", "broadcast_group"}
        assert helpers >= expected if horovod_converted else horovod == "-", horovod
        assert int(keras) > 0
        assert in_step == "True"  # the allreduce kept both replicas' weights equal
        # the optimizer was built before the first step: the train step traced once, not
        # again after it created the optimizer's variables
        assert traced == "1"
