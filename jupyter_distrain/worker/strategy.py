"""``jupyter_distrain.strategy()``: the tf.distribute strategy that fits the job's backend."""

from __future__ import annotations

import os
from typing import Any

from ..contract.process import Env


def strategy() -> Any:
    """Call inside a distributed cell.

    - ``ps``: ``ParameterServerStrategy`` over the job's TF_CONFIG (on the chief);
    - ``tf``: ``MultiWorkerMirroredStrategy``;
    - anything else (Horovod does its own allreduce): TensorFlow's default strategy.
    """
    import tensorflow as tf

    backend = os.environ.get(Env.BACKEND, "")
    if backend == "ps":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    if backend == "tf":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()
