"""Instruments Keras ``Model.fit`` with no change to the user's code.

An import hook waits for Keras's training module to load, then wraps
``Model.fit`` so that every call gets two callbacks:

- :class:`StepMetrics`-style reporting of per-step time, images, images/sec and
  loss (images per step from ``batch_size``, the dataset's static batch
  dimension, or ``--batch-size``);
- ``BackupAndRestore`` into the job's ``checkpoints/`` (it restores at the
  start of ``fit``), which backs up only on request: at each epoch end the
  replicas agree on the supervisor's checkpoint request (one tiny allreduce);
  when it is set, the epoch is backed up and the process exits with
  ``CHECKPOINT_EXIT`` so the job restarts at a new size and resumes there.

Keras 2 (tf.keras up to TensorFlow 2.15, and tf-keras) builds its optimizer's variables
at the first step, inside the traced train function, so TensorFlow traces that function
twice (a function that creates variables is traced again without creating them). The
wrapped ``fit`` builds the optimizer on the model's trainable variables first, under the
model's strategy, as Keras does itself when it loads a saved model: one trace, ~0.1 s
less before a rank's first step here. Keras 3 builds it before its first step itself.

TensorFlow is never imported here before the user's program imports it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..contract.metrics import reporter
from ..contract.process import Env, WorkerChannels, rank_from
from ..contract.store import JobDir
from . import instrument
from .patching import patch_on_import

# Where each Keras defines Model.fit: (module, class, the package whose callbacks to use,
# whether its optimizer is built at the first step, in the traced function)
FIT_DEFINITIONS = (
    ("keras.src.engine.training", "Model", "keras", True),  # Keras 2.15: TF 2.15's tf.keras
    ("tf_keras.src.engine.training", "Model", "tf_keras", True),  # tf-keras: on TF 2.16+
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "keras", False),  # Keras 3
    ("keras.src.backend.jax.trainer", "JAXTrainer", "keras", False),  # Keras 3 on JAX
)
KERAS_DEFAULT_BATCH = 32


def images_per_step(x: Any, batch_size: int | None) -> int | None:
    """Images in one step of ``fit(x, batch_size=...)``, when it can be known."""
    if batch_size:
        return int(batch_size)
    env = os.environ.get(Env.BATCH_SIZE)
    element_spec = getattr(x, "element_spec", None)
    if element_spec is not None:  # a tf.data.Dataset
        first = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        first = next(iter(first.values())) if isinstance(first, dict) else first
        shape = getattr(first, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
        return int(env) if env else None
    if hasattr(x, "shape") or isinstance(x, list | tuple | dict):
        return KERAS_DEFAULT_BATCH  # arrays: Keras batches them by 32 by default
    return int(env) if env else None


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _horovod_size() -> int:
    hvd = sys.modules.get("horovod.tensorflow")
    try:
        return hvd.size() if hvd is not None and hvd.is_initialized() else 0
    except Exception:  # horovod imported but not initialised
        return 0


def _jax_processes() -> int:
    """How many processes a multi-process JAX program has (0: JAX not initialised)."""
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    if state is None or getattr(state, "client", None) is None:
        return 0
    return int(state.num_processes or 0)


def _world_size() -> int:
    """Processes that train one model together through Horovod or JAX (0: neither)."""
    return max(_horovod_size(), _jax_processes())


def make_callbacks(keras: Any, images: int | None) -> list[Any]:
    """The callbacks added to every ``fit``: metrics first, then backup + checkpoint check."""

    class StepMetrics(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self.step = 0
            self.total_steps: int | None = None
            self.epoch = 0
            self.rates = instrument.RateWindow()

        def on_train_begin(self, logs: Any = None) -> None:
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            self.total_steps = steps * epochs if steps and epochs else None

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            steps = self.params.get("steps") or 0
            self.step = max(self.step, epoch * steps)  # resumed runs start past step 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            end = time.perf_counter()
            self.step += 1
            record: dict[str, Any] = {"step": self.step, "time": time.time(), "epoch": self.epoch}
            if images:
                rate = self.rates.add(end, images, end - self.start)
                record.update(images=images, images_per_sec=rate)
            # under ParameterServerStrategy logs are a RemoteValue: fetching it would wait
            # for the step (Keras only schedules it here), so the loss is left out
            loss = logs.get("loss") if isinstance(logs, dict) else None
            if loss is not None:
                record["loss"] = float(loss)
            if self.total_steps:
                record["total_steps"] = self.total_steps
            sender = reporter()
            if sender is not None:
                sender.report(record)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            sender = reporter()
            if sender is not None and isinstance(logs, dict):
                scalars = {k: float(v) for k, v in logs.items() if _is_number(v)}
                sender.report({"epoch_end": epoch, "time": time.time(), **scalars})

    class BackupOnRequest(keras.callbacks.BackupAndRestore):
        """BackupAndRestore that writes its backup only when the supervisor asks (then the
        process exits for the restart), so training that is not rescaled pays nothing;
        with ``--checkpoint-every``, at every epoch's end too (and goes on).
        Keras 2's backs up through ``_backup``, Keras 3's through ``_save_model``; each
        rank into its own directory (see :func:`_backup_dir`)."""

        def on_train_begin(self, logs: Any = None) -> None:
            # Keras 3's restore needs a built model even when there is nothing to restore
            if keras2 or os.path.exists(self._weights_path):
                super().on_train_begin(logs)

        # BackupAndRestore assigns a variable every batch, for batch-level and
        # preemption saving: neither is used here, and the assign costs ~3% of a small step
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            pass

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            pass

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if _agreed(self.model, instrument.should_checkpoint()):
                self._write(epoch)
                print(f"jupyter_distrain: checkpointed after epoch {epoch}; restarting", flush=True)
                raise SystemExit(instrument.CHECKPOINT_EXIT)
            if os.environ.get(Env.CHECKPOINT_EVERY):  # what a --max-restarts restart resumes
                self._write(epoch)

        def _write(self, epoch: int) -> None:
            if keras2:
                self._backup(epoch=epoch)
            else:  # every rank: under JAX, reading the weights is a collective
                self._current_epoch = epoch + 1
                self._save_model()

    global _fits
    callbacks = [StepMetrics()]
    backup_dir = _backup_dir(_fits)
    _fits += 1
    # kept on a checkpoint exit, deleted when the fit completes
    keras2 = hasattr(keras.callbacks.BackupAndRestore, "_backup")
    if backup_dir is not None:
        callbacks.append(BackupOnRequest(str(backup_dir), delete_checkpoint=True))
    return callbacks


def _agreed(model: Any, flag: bool) -> bool:
    """The checkpoint request, agreed by every replica (the max over them)."""
    if _jax_processes() > 1:
        import numpy as np
        from jax.experimental import multihost_utils

        return bool(np.max(multihost_utils.process_allgather(np.int32(flag))) > 0)
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:  # Keras 3 on JAX or torch in one process
        return flag
    import tensorflow as tf

    if _horovod_size() > 1:
        import horovod.tensorflow as hvd

        votes = hvd.allreduce(tf.constant(int(flag)), op=hvd.Sum, name="distrain_checkpoint")
        return bool(votes > 0)
    if strategy.num_replicas_in_sync > 1 and not isinstance(
        strategy, tf.distribute.experimental.ParameterServerStrategy
    ):
        local = strategy.run(lambda: tf.constant(int(flag)))
        return bool(strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None) > 0)
    return flag


_fits = 0  # how many fit() calls this process has made


def _backup_dir(ordinal: int) -> Path | None:
    """Where this process keeps the Keras backup of its ``ordinal``-th ``fit``; None
    where BackupAndRestore cannot run.

    A backup belongs to one ``fit`` call (a later or earlier ``fit`` in the same
    program must never restore it) and is deleted when that ``fit`` completes. Under
    Horovod or JAX every rank restores from rank 0's backup (copied into its own directory
    first, since ranks must not write to the same files), so a job restarted at a
    new size resumes every rank from the same epoch.
    """
    if os.environ.get(Env.BACKEND) in ("ps", "plain"):
        return None  # BackupAndRestore does not support ParameterServerStrategy
    if os.environ.get("HOROVOD_ELASTIC"):
        return None  # elastic Horovod resizes in place: its own state is the checkpoint
    channels = WorkerChannels.from_env()
    job = JobDir(channels.job_dir) if channels else JobDir(instrument.checkpoint_dir().parent)
    base = job.keras_backup_dir() / f"fit-{ordinal}"
    rank = rank_from(os.environ)
    if _world_size() <= 1 or rank == 0:
        return base
    own = job.keras_backup_dir(rank) / f"fit-{ordinal}"
    shutil.rmtree(own, ignore_errors=True)
    if base.exists():
        shutil.copytree(base, own)
    return own


def build_optimizer(model: Any, optimizer: Any) -> None:
    """Create the optimizer's variables now if it has not yet (no-op otherwise)."""
    if optimizer is None or not getattr(model, "built", True) or getattr(optimizer, "_built", 0):
        return
    if hasattr(optimizer, "_create_all_weights"):  # legacy optimizers: creates what is missing
        optimizer._create_all_weights(model.trainable_variables)
    elif hasattr(optimizer, "build"):  # Keras 2.11+ optimizers, not built before a first step
        optimizer.build(model.trainable_variables)


def build_optimizer_in_scope(model: Any) -> None:
    """Build a compiled Keras 2 model's optimizer under the model's strategy."""
    optimizer = getattr(model, "optimizer", None)
    strategy = getattr(model, "distribute_strategy", None)
    if optimizer is None or strategy is None:
        return
    with strategy.scope():
        build_optimizer(model, optimizer)


def wrap_fit(
    training_module: Any,
    class_name: str = "Model",
    package: str = "keras",
    builds_optimizer_late: bool = False,
) -> None:
    """Replace ``fit`` of ``training_module.<class_name>`` with a version that adds the
    callbacks above (those of Keras ``package``), and builds the optimizer first where
    ``builds_optimizer_late`` (Keras 2)."""
    model_cls = getattr(training_module, class_name)
    original = model_cls.fit
    if getattr(original, "_distrain_wrapped", False):
        return
    signature = inspect.signature(original)
    keras = importlib.import_module(package)

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        extra = make_callbacks(
            keras, images_per_step(arguments.get("x"), arguments.get("batch_size"))
        )
        arguments["callbacks"] = [*(arguments.get("callbacks") or []), *extra]
        if builds_optimizer_late:
            build_optimizer_in_scope(self)
        return original(*bound.args, **bound.kwargs)

    fit._distrain_wrapped = True  # type: ignore[attr-defined]
    fit.__doc__ = original.__doc__
    model_cls.fit = fit


def install() -> None:
    """Instrument Keras when (if ever) the program imports it, whichever Keras it is."""
    for module, class_name, package, late in FIT_DEFINITIONS:
        wrap = functools.partial(
            wrap_fit, class_name=class_name, package=package, builds_optimizer_late=late
        )
        patch_on_import(module, wrap)
