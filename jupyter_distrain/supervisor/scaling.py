"""The scaling protocol: resize in place where the backend's services can (elastic
Horovod); otherwise ask every member to checkpoint, wait until every member has exited
with ``CHECKPOINT_EXIT`` (rank 0 may still be writing the backup the next generation
resumes from when the others are done), and restart the job at the new size. A member
that ends any other way meanwhile fails the job: a restart must never resume from a
backup nobody finished."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from ..contract import CHECKPOINT_EXIT
from ..store import ProcessRecord
from ..timing import Deadline

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

    def request(self, workers: int) -> None:
        """Scale to ``workers``; raises ValueError when the job cannot scale now."""
        sup = self.supervisor
        if sup.status.state != "running":
            raise ValueError(f"cannot scale a job that is {sup.status.state}")
        if workers == sup.spec.workers:
            return
        sup.job.append_event("scale_requested", workers=workers, previous=sup.spec.workers)
        assert sup.gen is not None and sup.gen.plan is not None
        if sup.gen.plan.services.resize(workers):
            sup.resized(workers)
            sup.job.append_event("scaled_in_place", workers=workers)
            return
        self.target = workers
        self.deadline = Deadline(SCALE_TIMEOUT_SECONDS)
        sup.status.scaling_to = workers
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
            sup.fail(
                f"{record.describe()} ended with exit code {record.exit_code} while the job "
                "checkpointed to scale: not restarting",
                process=str(record.id),
            )
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
        sup.gen.stop(sup.spec.grace)
        sup.job.append_event(
            "restart",
            generation=sup.gen.number + 1,
            workers=workers,
            previous=[r.to_dict() for r in sup.table.rows()],
        )
        self.done()
        sup.resized(workers)
        sup.launch()

    def checkpointed(self, code: int) -> bool:
        """Whether an exit with ``code`` is a member's answer to a pending request."""
        return self.target is not None and code == CHECKPOINT_EXIT

    def done(self) -> None:
        self.target, self.drain = None, None
        self.supervisor.status.scaling_to = None

    def expire(self) -> None:
        """Restart once the drain has run out; drop a request the workers did not answer
        in time (they never checkpoint)."""
        if self.drain is not None and self.drain.expired:
            self.supervisor.job.append_event("drain_timeout", seconds=DRAIN_SECONDS)
            self.restart()
        elif self.target is not None and self.drain is None and self.deadline.expired:
            self.supervisor.job.append_event(
                "scale_failed", reason="the workers did not checkpoint in time"
            )
            self.done()
            self.supervisor.dirty = True
