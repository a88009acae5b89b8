"""Restarts after a failure (``--max-restarts N``, as torchrun's): a rank that fails, a
process unheard past ``--hang-timeout`` or over ``--memory`` ends the generation, and
the next one starts at the same size, its program resuming from the job's last
checkpoint (``checkpoints/``: ``jupyter_distrain.torch.checkpointed``, Keras backups),
up to N times; then the job fails with the last failure, as without the flag.

Each restart is a warning the cell, the widget and the store keep ("restart 1 of 3
after rank 1 failed first (exit code 3); its log keeps the traceback"), an event
(``restart`` with the reason and the ended generation's rows) and ``restarts`` in
state.json. A process's log is appended to by every generation, so each failure's
traceback stays on disk above the next run's output.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import Supervisor

log = logging.getLogger(__name__)


class Restarts:
    """Counts the restarts a job has had; decides whether a failure is one more."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def fail_or_restart(self, error: str, tail: str = "", **event: Any) -> None:
        """A rank failed with ``error``: restart the job while restarts are left (and it
        is not being stopped), else fail it as :meth:`Supervisor.fail` does."""
        sup = self.supervisor
        limit, done = sup.spec.max_restarts, sup.status.restarts
        if done >= limit or sup.stopping or sup.status.done or sup.gen is None:
            sup.fail(error, tail, **event)
            return
        sup.status.restarts = done + 1
        sup.warn(f"restart {done + 1} of {limit} after {error}; its log keeps the traceback")
        log.info("restarting after a failure: %s", error)
        next_generation(sup, sup.spec.workers, reason=error)


def next_generation(sup: Supervisor, workers: int, **event: Any) -> None:
    """End this generation (SIGTERM, ``--grace``, SIGKILL) and launch the next with
    ``workers``; the ``restart`` event keeps the ended generation's rows (a scale's
    restart and a failure's alike)."""
    assert sup.gen is not None
    sup.gen.stop(sup.spec.grace)
    sup.job.append_event(
        "restart",
        generation=sup.gen.number + 1,
        workers=workers,
        previous=[r.to_dict() for r in sup.table.rows()],
        **event,
    )
    sup.resized(workers)
    sup.launch()
