"""Two patches for Horovod programs, applied when (if ever) the program imports the
library.

**AutoGraph leaves Horovod's code alone.** Inside a ``tf.function`` (Keras's train
step), AutoGraph converts every library function it meets that is not TensorFlow's
own: for a Keras ``fit``, 16 of Horovod's (``allreduce``, ``_allreduce``,
``_allreduce_cond``, the compression, ``rank``, ``size``...) are read, transformed and
recompiled at a rank's first step, ~0.9 s of a 2-rank Keras job's ~1.8 s first step
on this machine. Horovod's code is written for TF1 graphs (it has
no Python control flow that depends on a tensor), so converting it changes nothing in
the traced graph: a rule "do not convert ``horovod``" ahead of AutoGraph's own rules
(``tensorflow.python.autograph.core.config.CONVERSION_RULES``, which exempts
``tensorflow`` the same way) skips that work. The rule cannot reach the bodies of
Horovod's own ``tf.function``s (``allreduce_grads``, which every ``DistributedOptimizer``
step calls, and ``broadcast_group``): a ``tf.function`` always converts its own body,
~0.35 s more at the first step. Horovod makes both with one helper
(``horovod.tensorflow.util._make_subgraph``); ours makes them with
``autograph=False``. Their Python branches and loops are over Python values (options,
lists of gradients and variables), so they trace to the same graph. ``--env
JUPYTER_DISTRAIN_HOROVOD_AUTOGRAPH=1`` converts all of it again.

**Horovod's documented elastic Keras path works with Keras's default optimizers.**
``hvd.elastic.KerasState.sync()`` broadcasts the model's variables, then the
optimizer's. A Keras 2.11+ optimizer creates its variables (``iteration``, slots)
lazily, at its first update; so a worker that joins a running job (scaling up) has
none yet while the others have theirs, the broadcasts of the two sides do not match,
and every rank waits for ever. Building the optimizer on the model's variables
before the broadcast gives every rank the same variables in the same order.

AutoGraph and Horovod
---------------------

Inside a `tf.function` (Keras's train step) AutoGraph converts every library function
it meets except TensorFlow's own: for a Horovod Keras `fit`, 16 of Horovod's functions
(`allreduce`, `_allreduce`, `_allreduce_cond`, the compression, `rank`, `size`...) are
read, transformed and recompiled at each rank's first step. Horovod's code is written
for TF1 graphs (no Python control flow on tensors), so the conversion changes nothing
in the traced graph. Every worker puts a rule "do not convert `horovod`" ahead of
AutoGraph's own (`tensorflow.python.autograph.core.config.CONVERSION_RULES`, where
`tensorflow` is exempted the same way), applied when TensorFlow is imported (at once
in a pooled process). Measured (`horovodrun --gloo -np 2` of a small Keras conv net,
two runs each): the first step took 1.72-1.83 s with the conversion and 0.79-0.86 s
without, at the same steps/sec.

The rule does not reach the bodies of Horovod's own `tf.function`s: a `tf.function`
always converts its own body (AutoGraph's `user_requested` path skips the rules).
There are two, both made by one helper, `horovod.tensorflow.util._make_subgraph`:
`allreduce_grads`, called by every `DistributedOptimizer` step, and
`broadcast_group` (`BroadcastGlobalVariablesCallback`, `hvd.broadcast_variables`).
Timed one by one at a rank's first step, converting `allreduce_grads` took 0.30-0.39 s
and `broadcast_group` 0.02-0.03 s, against 0.02 s for Keras's own train function.
Their branches and loops are over Python values (options, the lists of gradients
and variables), so the workers make them with `tf.function(f, autograph=False)`:
the helper is replaced in `horovod.tensorflow.util` when it is imported, and in the
two modules that took it by name (`horovod.tensorflow`, `.functions`) when they
were imported first (a pooled process). Measured the same way, 2 runs each, the
first step took 0.95 s with the conversion and 0.54-0.59 s without.
`tests/test_horovod.py` checks that no Horovod function is converted and that both
replicas' weights stay equal, and that `--env JUPYTER_DISTRAIN_HOROVOD_AUTOGRAPH=1`
restores TensorFlow's behaviour; `tests/test_pool.py` checks the same in pooled
processes.

A Keras 2 model (tf.keras up to TensorFlow 2.15, tf-keras after it) creates its
optimizer's variables at its first step, inside the traced train function. A
`tf.function` whose first trace creates variables is traced a second time without
creating them, so a rank's first step traced Keras's train step twice. The wrapped
`fit` (`worker/keras_hook.py`) first builds the optimizer on the model's trainable
variables, under the model's strategy, as Keras itself does when it loads a saved
model: the train function is traced once (`experimental_get_tracing_count() == 1`,
checked in `tests/test_horovod.py`; 2 before). Measured in one process, 3 runs each:
the first one-step `fit` of the benchmark's conv net took 0.41-0.49 s before and
0.31-0.32 s after. Keras 3 builds its optimizer before the first step itself.
Horovod's elastic state uses the same `build_optimizer`.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .keras_hook import build_optimizer
from .patching import patch_on_import

ELASTIC_MODULE = "horovod.tensorflow.elastic"
AUTOGRAPH_CONFIG = "tensorflow.python.autograph.core.config"
HOROVOD_TF_UTIL = "horovod.tensorflow.util"
# the modules that take ``_make_subgraph`` from HOROVOD_TF_UTIL by name
SUBGRAPH_USERS = (HOROVOD_TF_UTIL, "horovod.tensorflow", "horovod.tensorflow.functions")


def leave_horovod_unconverted(config: Any) -> None:
    """Put "do not convert ``horovod``" first in AutoGraph's conversion rules (once)."""
    rules = tuple(config.CONVERSION_RULES)
    if not any(getattr(r, "_distrain", False) for r in rules):
        rule = config.DoNotConvert("horovod")
        rule._distrain = True
        config.CONVERSION_RULES = (rule, *rules)


def trace_subgraphs_unconverted(util: Any) -> None:
    """Have Horovod make its ``tf.function``s with ``autograph=False`` (once), in its
    util module and in the modules that already took the helper from it (a pooled
    process imported Horovod before the job's program ran)."""
    original = util._make_subgraph
    if getattr(original, "_distrain", False):
        return
    tf_function = util.tf.function

    def _make_subgraph(f: Any) -> Any:
        return tf_function(f, autograph=False)

    _make_subgraph._distrain = True  # type: ignore[attr-defined]
    for name in SUBGRAPH_USERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "_make_subgraph", None) is original:
            module._make_subgraph = _make_subgraph


def patch_elastic_state(module: Any) -> None:
    state_cls = module.TensorFlowKerasState
    original = state_cls.sync
    if getattr(original, "_distrain_wrapped", False):
        return

    @functools.wraps(original)
    def sync(self: Any) -> Any:
        build_optimizer(self.model, self.optimizer)
        return original(self)

    sync._distrain_wrapped = True  # type: ignore[attr-defined]
    state_cls.sync = sync


def install(elastic: bool, convert_horovod: bool) -> None:
    """When (if ever) the program imports them: patch Horovod's elastic state
    (``elastic``), and leave Horovod's code unconverted by AutoGraph unless
    ``convert_horovod`` (then AutoGraph converts it, as TensorFlow does by default)."""
    if elastic:
        patch_on_import(ELASTIC_MODULE, patch_elastic_state)
    if not convert_horovod:
        patch_on_import(AUTOGRAPH_CONFIG, leave_horovod_unconverted)
        patch_on_import(HOROVOD_TF_UTIL, trace_subgraphs_unconverted)
