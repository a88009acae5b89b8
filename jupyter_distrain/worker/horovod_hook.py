"""Makes Horovod's documented elastic Keras path work with Keras's default optimizers.

``hvd.elastic.KerasState.sync()`` broadcasts the model's variables, then the
optimizer's. A Keras 2.11+ optimizer creates its variables (``iteration``, slots)
lazily, at its first update; so a worker that joins a running job (scaling up) has
none yet while the others have theirs, the broadcasts of the two sides do not match,
and every rank waits for ever. Building the optimizer on the model's variables
before the broadcast gives every rank the same variables in the same order.
"""

from __future__ import annotations

import functools
from typing import Any

from .patching import patch_on_import

ELASTIC_MODULE = "horovod.tensorflow.elastic"


def build_optimizer(model: Any, optimizer: Any) -> None:
    """Create the optimizer's variables now if it has not yet (no-op otherwise)."""
    if optimizer is None or not getattr(model, "built", True) or getattr(optimizer, "_built", 0):
        return
    if hasattr(optimizer, "_create_all_weights"):  # legacy optimizers: creates what is missing
        optimizer._create_all_weights(model.trainable_variables)
    elif hasattr(optimizer, "build"):  # Keras 2.11+ optimizers, not built before a first step
        optimizer.build(model.trainable_variables)


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


def install() -> None:
    """Patch Horovod's elastic state when (if ever) the program imports it."""
    patch_on_import(ELASTIC_MODULE, patch_elastic_state)
