"""``--backend plain``: N independent copies of the program, no framework wiring.

This is what ``launch_workers`` runs (Cloudera's workers are independent
sessions): one worker failing does not stop the others; the job ends when all
have ended, failed if any failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.launch import Network, Slot
from ..contract.process import ProcessId
from ..contract.status import ProcessRecord
from .base import Backend, Outcome, Plan, WorkerCommand, failed_first, first_failure


class PlainBackend(Backend):
    name = "plain"

    def prepare(self, slots: list[Slot], network: Network, worker: WorkerCommand) -> Plan:
        return Plan([worker.process(ProcessId("worker", s.index), s, rank=s.index) for s in slots])

    def outcome(self, records: Sequence[ProcessRecord], ended: ProcessRecord) -> Outcome | None:
        if any(r.live for r in records):
            return None
        counted = [r for r in records if not r.stopped]
        if first_failure(counted) is None:
            return Outcome("succeeded")
        return failed_first(counted, ended)
