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

A host (node) is lost when its processes end with no exit code coming back (the ssh
connection, the Slurm task, the Ray actor gone: ``LaunchedProcess.host_lost``). With
``--min-workers M`` the next generation goes without it (``JobSpec.left_out``: the ssh
launcher skips it, Slurm's allocation excludes it, Ray places on live nodes only) at
the workers its processes leave, while at least M remain; a scale up asks every host
again. Without the flag the job restarts at its size (a host that is back is used).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..contract.spec import JobSpec
    from .core import Supervisor

log = logging.getLogger(__name__)


class Restarts:
    """Counts the restarts a job has had; decides whether a failure is one more, and at
    what size."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def fail_or_restart(self, error: str, tail: str = "", **event: Any) -> None:
        """A rank failed with ``error``: restart the job while restarts are left (and it
        is not being stopped), else fail it as :meth:`Supervisor.fail` does. Hosts the
        ended generation lost are left out under ``--min-workers`` (see :func:`shrunk`)."""
        sup = self.supervisor
        limit, done = sup.spec.max_restarts, sup.status.restarts
        if done >= limit or sup.stopping or sup.status.done or sup.gen is None:
            sup.fail(error, tail, **event)
            return
        sup.gen.stop(sup.spec.grace)  # every exit known: which hosts answered no more
        lost = sup.gen.lost_hosts()
        workers, without = shrunk(sup.spec, lost)
        if workers < max(sup.spec.min_workers, 1):
            sup.fail(f"{error}; {without}", tail, **event)
            return
        sup.status.restarts = done + 1
        how = f"; {without}" if without else ""
        sup.warn(f"restart {done + 1} of {limit} after {error}{how}; its log keeps the traceback")
        log.info("restarting after a failure: %s%s", error, how)
        if workers != sup.spec.workers:
            sup.spec.left_out = sorted({*sup.spec.left_out, *lost})
        next_generation(sup, workers, reason=error, left_out=sup.spec.left_out)


def shrunk(spec: JobSpec, lost: dict[str, int]) -> tuple[int, str]:
    """The workers the next generation has after ``lost`` hosts (with the processes each
    held), and what to say of them ("" when none was lost). With ``--min-workers`` the
    lost hosts are left out and their processes' share of the workers goes with them;
    without it the job keeps its size (the host may be back)."""
    if not lost:
        return spec.workers, ""
    hosts = ", ".join(lost)
    named = f"host{'s' * (len(lost) > 1)} {hosts} {'were' if len(lost) > 1 else 'was'} lost"
    if not spec.min_workers:
        return spec.workers, f"{named}: restarting at the same size (no --min-workers)"
    left = spec.workers - sum(lost.values())
    if left < spec.min_workers:
        return left, (
            f"{named} and {max(left, 0)} worker{'s' * (left != 1)} would be left, "
            f"fewer than --min-workers {spec.min_workers}"
        )
    them = "them" if len(lost) > 1 else "it"
    return left, f"{named}: going on without {them} at {left} worker{'s' * (left != 1)}"


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
