"""What a PyTorch program in a ``--backend torch`` job may use (plain PyTorch needs none
of it: ``torch.distributed.init_process_group()`` works with no arguments).

- :func:`setup` initialises the process group (Gloo on CPU, NCCL where the ranks have
  GPUs) and returns the device this rank uses (``LOCAL_RANK`` indexes the GPUs);
- :func:`checkpointed` makes a training loop scalable: ``%distributed scale`` and the
  widget's +/- save the state at a step boundary (``torch.distributed.checkpoint``, so
  FSDP's sharded state works too) and the job restarts at the new world size from it,
  at the same global step::

      state = jdt.checkpointed(model=model, optimizer=optimizer, step=0)
      while state.step < steps:
          ...  # one step
          state.step += 1
          state.save_if_asked()  # saves and exits when a scale is asked; else nothing

Every rank must call :meth:`Checkpointed.save_if_asked` at the same steps: they agree
(one tiny allreduce) on whether to save, since the request reaches them at different
moments. With ``--checkpoint-every N`` (steps: calls of ``save_if_asked``) or ``Ns``
(seconds), it also saves then and goes on: what a ``--max-restarts`` restart resumes
from, saying so ("resumed from the checkpoint of step 20"). A save is written beside
the last one and takes its place once complete, so a failure while saving leaves the
previous checkpoint whole.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .contract.process import Env
from .worker.instrument import (
    CHECKPOINT_EXIT,
    checkpoint_dir,
    continue_steps_from,
    should_checkpoint,
)
from .worker.torch_hook import not_a_step

__all__ = ["Checkpointed", "checkpointed", "setup"]

STATE = "torch-state"  # the directory under the job's checkpoints/


def setup() -> torch.device:
    """Initialise the default process group once (NCCL when CUDA is available, else
    Gloo) and return this rank's device."""
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


class Checkpointed:
    """A model, its optimizer and plain values (``step``, ...) saved together, loaded
    from the job's last checkpoint if there is one (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, **values: Any):
        self.model = model
        self.optimizer = optimizer
        self.values = dict(values)
        self.path: Path = checkpoint_dir() / STATE
        self.resumed = (self.path / ".metadata").exists()
        self._every, self._calls, self._saved_at = _every(), 0, time.monotonic()
        if self.resumed:
            with not_a_step():
                self._load()
            if not dist.is_initialized() or dist.get_rank() == 0:
                step = self.values.get("step")
                at = f" of step {step}" if isinstance(step, int) else ""
                print(f"jupyter_distrain: resumed from the checkpoint{at}", flush=True)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if "values" in self.__dict__ and name in self.values:
            self.values[name] = value
        else:
            super().__setattr__(name, value)

    def _state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model), "values": dict(self.values)}
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optim, "values": dict(self.values)}

    def _load(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        state = self._state_dict()
        dcp.load(state, checkpoint_id=str(self.path), no_dist=_replicated(state))
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
        self.values.update(state["values"])
        if isinstance(self.values.get("step"), int):  # the widget's steps go on from there
            continue_steps_from(self.values["step"])

    def save(self) -> None:
        """Save now (every rank calls it), beside the last checkpoint, then the first rank
        of each host puts the host's new files in the last one's place (a job on several
        hosts has a job directory on each). State every rank holds whole (DDP's) is
        written whole on each host by that host's first rank, so any host can resume
        alone after the others are lost; sharded state (FSDP's DTensors) is written in
        parts, each rank its own (a collective)."""
        import torch.distributed.checkpoint as dcp

        new = self.path.with_name(STATE + ".new")
        first_on_host = int(os.environ.get("LOCAL_RANK", "0")) == 0
        with not_a_step():
            state = self._state_dict()
            if not _replicated(state):
                dcp.save(state, checkpoint_id=str(new))
            elif first_on_host:
                shutil.rmtree(new, ignore_errors=True)  # a save that was cut off
                dcp.save(state, checkpoint_id=str(new), no_dist=True)
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()  # every part written, the metadata too
        if first_on_host and new.exists():
            old = self.path.with_name(STATE + ".old")
            if self.path.exists():
                self.path.rename(old)
            new.rename(self.path)
            shutil.rmtree(old, ignore_errors=True)
        self._saved_at = time.monotonic()

    def save_if_asked(self) -> None:
        """If the job was asked to checkpoint (to scale), save on every rank and exit
        with ``CHECKPOINT_EXIT``; if a periodic checkpoint is due (``--checkpoint-every``),
        save and go on; otherwise return at once."""
        self._calls += 1
        asked = torch.tensor([1 if should_checkpoint() else 0, 1 if self._due() else 0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if asked[0].item():
            self.save()
            if dist.is_initialized():
                dist.destroy_process_group()
            raise SystemExit(CHECKPOINT_EXIT)
        if asked[1].item():
            self.save()

    def _due(self) -> bool:
        every, seconds = self._every
        if not every:
            return False
        if seconds:
            return time.monotonic() - self._saved_at >= every
        return self._calls % every == 0


def _replicated(state: Any) -> bool:
    """Whether ``state`` holds no sharded tensor (every rank has all of it)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return all(_replicated(v) for v in state.values())
    if isinstance(state, list | tuple):
        return all(_replicated(v) for v in state)
    return not isinstance(state, DTensor | ShardedTensor)


def _every() -> tuple[int, bool]:
    """``--checkpoint-every``: (N, whether N is seconds); (0, False) without it."""
    text = os.environ.get(Env.CHECKPOINT_EVERY, "")
    seconds = text.endswith("s")
    try:
        return int(text.removesuffix("s")), seconds
    except ValueError:
        return 0, False


def checkpointed(model: torch.nn.Module, optimizer: Any = None, **values: Any) -> Checkpointed:
    """The training state to save when the job scales, resumed from the last save."""
    return Checkpointed(model, optimizer, **values)
