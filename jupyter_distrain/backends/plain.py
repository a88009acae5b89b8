"""``--backend plain``: N independent copies of the program, no framework wiring.

This is what ``launch_workers`` runs (Cloudera's workers are independent
sessions): one worker failing does not stop the others; the job ends when all
have ended, failed if any failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..launchers.base import ProcessSpec, Slot
from ..store import ProcessRecord
from .base import Backend, Outcome, first_failure


class PlainBackend(Backend):
    name = "plain"

    def plan(
        self, slots: list[Slot], worker_argv: list[str], worker_env: dict[str, str]
    ) -> list[ProcessSpec]:
        return [
            ProcessSpec("worker", slot.index, worker_argv, dict(worker_env), slot, [slot.index])
            for slot in slots
        ]

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if any(r.live for r in records):
            return None
        culprit = first_failure([r for r in records if not r.stopped])
        if culprit is None:
            return Outcome("succeeded")
        return Outcome(
            "failed", f"{culprit.describe()} failed first (exit code {culprit.exit_code})", culprit
        )
