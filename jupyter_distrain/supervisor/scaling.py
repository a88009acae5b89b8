"""The scaling protocol: resize in place where the backend's services can (elastic
Horovod); otherwise ask every member to checkpoint, wait until every member has exited
with ``CHECKPOINT_EXIT`` (rank 0 may still be writing the backup the next generation
resumes from when the others are done), and restart the job at the new size. A member
that ends any other way meanwhile fails the job: a restart must never resume from a
backup nobody finished.

Scaling
-------

- **Checkpoint and restart** (every backend): `scale` sends SIGUSR1 to every
  process through its launcher handle; the bootstrap's handler sets a flag.
  Under Keras `fit`, at the next epoch end, the replicas agree on the flag (a
  Horovod allreduce, or the tf.distribute strategy's reduce), back up and exit
  with `CHECKPOINT_EXIT` (75). The supervisor then **waits for every member to
  exit** (rank 0 may still be writing the one backup the next generation
  resumes from when the others are done; up to 60 s, then the rest are stopped):
  only when all exited with 75 does it write the new worker count into
  spec.json and launch generation N+1 (records of the old processes go to
  events.jsonl, `restart`). A member ending any other way meanwhile fails the
  job ("rank 0 ended (exit code 1) while the job checkpointed to scale: not
  restarting"): a restart never resumes from a backup nobody finished. Under
  Horovod, rank 0's backup is the truth: other ranks copy it into their own
  directory before `fit`. **A backup belongs to one `fit` call** (the N-th of
  the program: `checkpoints/keras-backup/fit-N`) and is deleted when that `fit`
  completes, so a later `fit` in the same job never restores old weights.
  Custom loops use `should_checkpoint()`, `checkpoint_dir()` and exit 75
  themselves. A job that never checkpoints keeps running: after 10 minutes the
  request is dropped (`scale_failed`). BackupAndRestore does not support
  ParameterServerStrategy, so ps jobs scale only through custom checkpoints.
- **Elastic Horovod** (cells that use `hvd.elastic`): the backend's services
  are Horovod's `ElasticDriver` with a discovery object the supervisor changes
  (`SupervisorDiscovery`) and a rendezvous server bound to the driver address.
  The driver decides when processes start, so it calls back through the typed
  `JobHost` it was started with (`start_process` posts a `StartProcess` request
  to the loop and waits for its answer, so records, logs and cleanup stay the
  loop's); scaling changes the slot count, the driver starts the new worker
  (or removes the last one: its row is marked `stopped`, not lost) and the
  running ranks re-rendezvous without restarting. The driver reports the end
  (`backend_done`).
  - **Horovod's documented Keras path works with Keras's default optimizer.**
    `KerasState.sync()` broadcasts the model's variables, then the optimizer's;
    a Keras 2.11+ optimizer creates its variables at its first update, so a
    joining rank had none while the others had five, the broadcasts did not
    pair up and every rank waited for ever (seen: ranks 0 and 1 in
    `broadcast_variables(optimizer.variables())`, rank 2 already in
    `broadcast_object`, dumped with `kill -USR2`: the bootstrap registers
    `faulthandler` on SIGUSR2). `worker/horovod_hook.py` builds the optimizer
    on the model's variables before Horovod's `sync` (legacy optimizers: their
    `_create_all_weights`).
  - **A resize is tracked until it is done**: `scaling.InPlace` waits until
    every rank has made a step at the new size (`scaled` event with the
    seconds it took); if that does not happen within `--timeout`, the job fails
    naming the phase it was stuck in ("starting worker-2", "the rendezvous at
    size 3", "the state sync before a first step at size 3 (worker-2)").
    Horovod's `TensorFlowState` still deadlocks a joining worker in eager mode
    (it broadcasts in its constructor); such a job now fails that way instead
    of looking healthy.
- **Stalls**: when no rank's step has advanced for `--stall-timeout` seconds
  (default 60, 0 off) the cell prints, once per stall, "training stalled: no
  step since 21:04:31 (over 60 s): rank 0 at step 1305, rank 1 at step 1305",
  and the widget shows it. A process that is not heard at all (no heartbeat:
  SIGSTOP, frozen) for `--hang-timeout` seconds (default 120) fails the job.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..contract.process import CHECKPOINT_EXIT
from ..contract.session import SCALE_REFUSED
from ..contract.status import ProcessRecord
from ..timing import Deadline
from . import events as ev
from .policy import Fatal, Resized

if TYPE_CHECKING:
    from .core import Supervisor

log = logging.getLogger(__name__)

SCALE_TIMEOUT_SECONDS = 600.0  # how long workers may take to reach a checkpoint
DRAIN_SECONDS = 60.0  # after the first checkpoint exit, how long the others may take


class Scaling:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.target: int | None = None
        self.deadline = Deadline(None)
        self.drain: Deadline | None = None  # set once the first member checkpointed
        self.in_place: InPlace | None = None  # an in-place resize not yet complete

    def handlers(self) -> dict[type, Callable[[Any], Any]]:
        """What the loop does with a scale request."""
        return {ev.ScaleRequested: lambda e: self.request(e.workers)}

    def request(self, workers: int) -> None:
        """Scale to ``workers``; raises ValueError when the job cannot scale now."""
        sup = self.supervisor
        if sup.spec.session is not None:
            raise ValueError(SCALE_REFUSED)
        if sup.status.state != "running":
            raise ValueError(f"cannot scale a job that is {sup.status.state}")
        if workers == sup.spec.workers:
            return
        sup.job.append_event("scale_requested", workers=workers, previous=sup.spec.workers)
        assert sup.gen is not None and sup.gen.plan is not None
        previous = sup.spec.workers
        if sup.gen.plan.services.resize(workers):
            sup.resized(workers)
            sup.job.append_event("scaled_in_place", workers=workers)
            self.in_place = InPlace(workers, previous, sup)
            return
        asked = self.target is not None  # the members were asked already: the new size wins
        self.target = workers
        sup.status.scaling_to = workers
        sup.gen.launcher.expect(workers)  # the new generation's processes, ready meanwhile
        if not asked:
            self.deadline = Deadline(SCALE_TIMEOUT_SECONDS)
            for entry in sup.table.live_members():
                if entry.handle is not None:
                    entry.handle.signal(signal.SIGUSR1)
        sup.save()

    @property
    def draining(self) -> bool:
        return self.drain is not None

    def member_ended(self, record: ProcessRecord) -> None:
        """A member exited while (or by) checkpointing."""
        sup = self.supervisor
        if record.exit_code != CHECKPOINT_EXIT:
            self.done()
            ended = (
                f"{record.describe()} ended ({record.ended_text()}) while the job "
                "checkpointed to scale: not restarting"
            )
            sup.policy.decide(Fatal(ended, process=str(record.id)))
            return
        if self.drain is None:
            self.drain = Deadline(DRAIN_SECONDS)
            sup.job.append_event("checkpointed", process=str(record.id))
        if not sup.table.live_members():
            self.restart()

    def restart(self) -> None:
        """Every member checkpointed (or the drain ran out): stop what is left of this
        generation, launch the next at the new size."""
        sup = self.supervisor
        assert sup.gen is not None and self.target is not None
        workers = self.target
        log.info("restarting with %d workers", workers)
        self.done()
        sup.policy.decide(Resized(workers))

    def checkpointed(self, code: int) -> bool:
        """Whether an exit with ``code`` is a member's answer to a pending request."""
        return self.target is not None and code == CHECKPOINT_EXIT

    def done(self) -> None:
        self.target, self.drain = None, None
        self.supervisor.status.scaling_to = None

    def leaving(self, record: ProcessRecord) -> bool:
        """Whether a member that just ended was removed by an in-place shrink."""
        resize = self.in_place
        return (
            resize is not None
            and resize.workers < resize.previous
            and record.index >= resize.workers
        )

    def expire(self) -> None:
        """Check an in-place resize; restart once the drain has run out; drop a request
        the workers did not answer in time (they never checkpoint)."""
        if self.in_place is not None:
            self.in_place.check()
        if self.drain is not None and self.drain.expired:
            self.supervisor.job.append_event("drain_timeout", seconds=DRAIN_SECONDS)
            self.restart()
        elif self.target is not None and self.drain is None and self.deadline.expired:
            self.supervisor.job.append_event(
                "scale_failed", reason="the workers did not checkpoint in time"
            )
            self.done()
            self.supervisor.dirty = True


class InPlace:
    """An in-place resize (elastic Horovod) until every rank trains at the new size: it
    must complete within ``--timeout``, or the job fails naming the phase it was stuck
    in (a new worker not started, the rendezvous, or the state sync before a first step
    at the new size)."""

    def __init__(self, workers: int, previous: int, supervisor: Supervisor):
        self.workers, self.previous = workers, previous
        self.supervisor = supervisor
        self.since = time.monotonic()
        self.deadline = Deadline(supervisor.spec.timeout)

    def phase(self) -> str | None:
        """What is not done yet; None once every rank has stepped at the new size."""
        live = self.supervisor.table.live_members()
        starting = [str(e.record.id) for e in live if e.record.state != "running"]
        if starting:
            return f"starting {', '.join(starting)}"
        if len(live) != self.workers:
            return f"the rendezvous at size {self.workers} ({len(live)} workers up)"
        still = [str(e.record.id) for e in live if (e.last_step_at or 0) <= self.since]
        if still:
            return f"the state sync before a first step at size {self.workers} ({', '.join(still)})"
        return None

    def check(self) -> None:
        sup = self.supervisor
        phase = self.phase()
        if phase is None:
            sup.job.append_event(
                "scaled", workers=self.workers, seconds=round(time.monotonic() - self.since, 3)
            )
            sup.scaling.in_place = None
        elif self.deadline.expired:
            sup.scaling.in_place = None
            sup.policy.decide(
                Fatal(
                    f"scaling to {self.workers} workers did not complete within "
                    f"{sup.spec.timeout:g} s: stuck in {phase}"
                )
            )
