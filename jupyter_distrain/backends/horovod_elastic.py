"""Elastic Horovod: Horovod's own ElasticDriver, with the supervisor as host discovery.

The driver decides when worker processes start (at launch, and when slots are
added), so these services ask the supervisor to start each one through the
:class:`JobHost` they are started with; the supervisor still records and owns
every process. Scaling changes what discovery reports; the driver then starts
the new workers and the running ones re-rendezvous at the new size without
restarting.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from ..contract.launch import LaunchedProcess, Slot
from ..contract.process import ProcessId
from .base import JobHost, Services, WorkerCommand
from .horovod_rendezvous import bound_rendezvous, gloo_rank_env

log = logging.getLogger(__name__)

WAIT_SECONDS = 0.2


class SupervisorDiscovery:
    """Horovod's HostDiscovery interface over a dict the supervisor changes."""

    def __init__(self, hosts: dict[str, int]):
        self.hosts = dict(hosts)
        self.lock = threading.Lock()

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        with self.lock:
            return dict(self.hosts)

    def set_slots(self, host: str, slots: int) -> None:
        with self.lock:
            self.hosts[host] = slots


class ElasticRun(Services):
    """One elastic job: the driver, its rendezvous server and the worker threads."""

    def __init__(self, slots: list[Slot], address: str, worker: WorkerCommand, timeout: int):
        from horovod.runner.elastic.driver import ElasticDriver
        from horovod.runner.elastic.rendezvous import create_rendezvous_handler

        self.slots = {s.host: s for s in slots}
        counts: dict[str, int] = {}
        for slot in slots:
            counts[slot.host] = counts.get(slot.host, 0) + 1
        self.discovery = SupervisorDiscovery(counts)
        self.rendezvous = bound_rendezvous(address)
        self.driver = ElasticDriver(
            self.rendezvous, self.discovery, min_num_proc=1, max_num_proc=None, timeout=timeout
        )
        self.port = self.rendezvous.start(create_rendezvous_handler(self.driver))
        self.address = address
        self.worker = worker
        self.host: JobHost | None = None
        self.driver.wait_for_available_slots(len(slots))

    def start(self, host: JobHost) -> None:
        self.host = host
        workers = sum(self.discovery.find_available_hosts_and_slots().values())
        self.driver.start(workers, self._create_worker)
        threading.Thread(target=self._wait_results, name="elastic-results", daemon=True).start()

    def _create_worker(self, slot_info: Any, events: list[threading.Event]) -> tuple[int, float]:
        assert self.host is not None
        template = self.slots.get(slot_info.hostname)
        slot = Slot(
            slot_info.hostname,
            template.address if template else self.address,
            slot_info.rank,
            slot_info.local_rank,
            template.iface if template else "lo",
        )
        proc = self.worker.process(
            ProcessId("worker", slot_info.local_rank),
            slot,
            rank=slot_info.rank,
            HOROVOD_ELASTIC="1",
            **gloo_rank_env(slot, slot_info, self.address, self.port),
        )
        try:
            launched: LaunchedProcess = self.host.start_process(proc)
        except Exception:  # the driver's thread must return a result, or the job hangs
            log.exception("cannot start %s", proc.id)
            return 1, time.time()
        while launched.poll() is None:
            if any(e.is_set() for e in events):
                launched.signal(signal.SIGTERM, tree=True)
                break
            time.sleep(WAIT_SECONDS)
        return launched.wait(), time.time()

    def _wait_results(self) -> None:
        results = self.driver.get_results()
        assert self.host is not None
        self.host.backend_done(results.error_message or _all_failed(results.worker_results))

    def resize(self, workers: int) -> bool:
        host = next(iter(self.discovery.hosts))
        self.discovery.set_slots(host, workers)
        return True

    def stop(self) -> None:
        if not self.driver.finished():
            self.driver.stop()
        self.rendezvous.stop()


def _all_failed(worker_results: dict[str, tuple[int, float]]) -> str | None:
    """The driver ends without an error when every worker failed at once (it has nobody
    left to retry with): that is a failure, not a success."""
    codes = {name: code for name, (code, _) in worker_results.items()}
    if not codes or any(code == 0 for code in codes.values()):
        return None
    listed = ", ".join(f"{name} exit code {code}" for name, code in sorted(codes.items()))
    return f"every elastic worker failed ({listed})"
