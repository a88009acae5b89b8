"""The scaling protocol: resize in place where the backend's services can (elastic
Horovod); otherwise ask every member to checkpoint, and restart the job at the new size
when the first of them exits with ``CHECKPOINT_EXIT``."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from ..contract import CHECKPOINT_EXIT
from ..timing import Deadline

if TYPE_CHECKING:
    from .core import Supervisor

log = logging.getLogger(__name__)

SCALE_TIMEOUT_SECONDS = 600.0  # how long workers may take to reach a checkpoint


class Scaling:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.target: int | None = None
        self.deadline = Deadline(None)

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

    def restart(self) -> None:
        """A member checkpointed: stop this generation, launch the next at the new size."""
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
        self.target = None
        self.supervisor.status.scaling_to = None

    def expire(self) -> None:
        """Drop a request the workers did not answer in time (they never checkpoint)."""
        if self.target is not None and self.deadline.expired:
            self.supervisor.job.append_event(
                "scale_failed", reason="the workers did not checkpoint in time"
            )
            self.done()
            self.supervisor.dirty = True
