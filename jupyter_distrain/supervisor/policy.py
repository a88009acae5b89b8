"""A job's fate, decided in one place, as torchelastic's agent keeps its restart policy in
one loop: every part of the supervisor that sees the job end or go wrong reports it here
as one :data:`Ending`, and :meth:`Policy.decide` says what becomes of the job; the
supervisor's verbs (``fail``, ``stop``, ``finish``, ``launch``) carry it out.

- :class:`Failed`: a member failed (the backend's rule after its exit), went unheard past
  ``--hang-timeout`` or exceeded ``--memory``. With ``--max-restarts N`` (as torchrun's)
  the generation ends and the next starts at the same size, its program resuming from
  the job's last checkpoint (``checkpoints/``: ``jupyter_distrain.torch.checkpointed``,
  Keras backups), up to N times; then, or without the flag, the job fails with it.
- :class:`Fatal`: what no restart mends (the start past ``--timeout``, a full disk, a
  scale that could not complete, a server refused without isolation, a session whose
  processes run no cell, the backend's own driver failing): the job fails.
- :class:`Resized`: every member checkpointed for a scale: the next generation at the
  new size.
- :class:`Stopped`: the user (Stop, interrupt) or a session's kernel gone: the job stops.
- :class:`Succeeded`: the backend's rule says the job is done: what is left stops after
  the grace and the job succeeds.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..contract.spec import JobSpec
    from .core import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failed:
    """A member failed in a way a restart may mend."""

    error: str
    tail: str = ""  # the last lines of the culprit's log
    process: str | None = None  # the culprit, for the event


@dataclass(frozen=True)
class Fatal:
    """The job cannot go on."""

    error: str
    process: str | None = None


@dataclass(frozen=True)
class Resized:
    """Every member checkpointed for a scale to ``workers``."""

    workers: int


@dataclass(frozen=True)
class Stopped:
    reason: str


@dataclass(frozen=True)
class Succeeded:
    pass


Ending = Failed | Fatal | Resized | Stopped | Succeeded


class Policy:
    """Decides what an :data:`Ending` makes of the job, and counts its restarts."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def decide(self, ending: Ending) -> None:
        sup = self.supervisor
        match ending:
            case Failed(error, tail, process):
                self._restart_or_fail(error, tail, _named(process))
            case Fatal(error, process):
                sup.fail(error, **_named(process))
            case Resized(workers):
                if workers > sup.spec.workers:  # the user asks for more: every host again
                    sup.spec.left_out = []
                next_generation(sup, workers)
            case Stopped(reason):
                sup.stop(reason)
            case Succeeded():
                sup.finish("succeeded")

    def _restart_or_fail(self, error: str, tail: str, event: dict[str, Any]) -> None:
        """Restart the job while restarts are left (and it is not being stopped), else
        fail it. Hosts the ended generation lost are left out under ``--min-workers``
        (see :func:`shrunk`)."""
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


def _named(process: str | None) -> dict[str, Any]:
    return {"process": process} if process is not None else {}


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
