"""Steps and images/sec of a PyTorch program, with no change to its code.

When (if ever) the program imports torch, a global optimizer step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``) reports one step per
``optimizer.step()`` of the first optimizer that steps (a GAN's second optimizer does
not count twice), and the batches a ``DataLoader`` yields give the images of a step
(the first dimension of the first tensor in the batch). A program that calls
:func:`..instrument.report` or :func:`..instrument.timed_step` itself is left to do so:
the hook stops at its first such call. A step costs the hook a few microseconds.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import instrument
from .patching import patch_on_import

_state: dict[str, Any] = {"optimizer": None, "images": None, "quiet": 0}
SETTLE_SECONDS = 0.1
STORE_WAIT_SECONDS = 300.0


@contextmanager
def not_a_step() -> Iterator[None]:
    """Optimizer steps within are not training steps (torch.distributed.checkpoint
    steps an optimizer with zero gradients to make its state)."""
    _state["quiet"] += 1
    try:
        yield
    finally:
        _state["quiet"] -= 1


def batch_size(batch: Any) -> int | None:
    """The first dimension of the first tensor in ``batch`` (a tensor, or a list, tuple
    or dict of them, nested), else None."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            found = batch_size(item)
            if found is not None:
                return found
    return None


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _state["quiet"] or instrument.reported_by_program():
        return
    if _state["optimizer"] is None:
        _state["optimizer"] = id(optimizer)
    elif _state["optimizer"] != id(optimizer):
        return
    instrument.record_step(images=_state["images"])


def _hook_optimizer(module: Any) -> None:
    module.register_optimizer_step_post_hook(_after_step)


def _hook_dataloader(module: Any) -> None:
    iterator = module._BaseDataLoaderIter
    original = iterator.__next__

    def __next__(self: Any) -> Any:
        batch = original(self)
        _state["images"] = batch_size(batch)
        return batch

    iterator.__next__ = __next__


def install() -> None:
    """Instrument PyTorch when (if ever) the program imports it."""
    patch_on_import("torch.optim.optimizer", _hook_optimizer)
    patch_on_import("torch.utils.data.dataloader", _hook_dataloader)


def settle() -> None:
    """Before the program's objects are freed: give Gloo's threads the GIL, so that each
    can let go of the last work it finished.

    A work started in a backward pass holds a Python object (the context torch 2.13
    keeps in its thread-local state), so the thread that ran it needs the GIL to drop
    it. Freeing the program's DistributedDataParallel frees its process group, whose
    destructor joins those threads with the GIL held: if one is still waiting for the
    GIL, both wait for ever (4 of 10 warm runs of the launch benchmark's program hung
    so). A sleep releases the GIL.
    """
    if "torch.distributed" in sys.modules:
        time.sleep(SETTLE_SECONDS)


def wait_for_store(environ: Mapping[str, str] = os.environ) -> None:
    """On a rank other than 0: until rank 0's TCPStore (``MASTER_ADDR:MASTER_PORT``)
    takes connections.

    torch's store client, refused while rank 0 is still importing torch, backs off
    (about half a second, with jitter) before it tries again: a cold job's ranks left
    ``init_process_group`` 0.5 s after rank 0 was there. A plain connect every 10 ms
    costs nothing rank 0 notices.
    """
    address, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if environ.get("RANK", "0") == "0" or not address or not port:
        return
    deadline = time.monotonic() + STORE_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, int(port)), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.01)


def _wait_in_init(module: Any) -> None:
    if not hasattr(module, "init_process_group"):
        return  # a torch built without distributed support
    original = module.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        from_env = len(args) < 2 and kwargs.get("init_method") in (None, "env://")
        if from_env and kwargs.get("store") is None:
            wait_for_store()
        return original(*args, **kwargs)

    module.init_process_group = module.distributed_c10d.init_process_group = init_process_group


def install_store_wait() -> None:
    """Have ``init_process_group`` from the environment (torchrun's variables) wait for
    rank 0's store, when (if ever) the program imports ``torch.distributed``."""
    patch_on_import("torch.distributed", _wait_in_init)
