"""The supervisor's event loop: the only writer of the job's state.

Every other thread (control server, metrics collector, process waiters, an
elastic driver, signal handlers) posts an event to the loop's inbox; requests
that want an answer get a future. The loop applies each event to the process
table and the job's state, ticks its periodic duties and writes the store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import WorkerCommand
from ..contract.launch import LaunchedProcess, ProcessSpec
from ..contract.process import ProcessId
from ..contract.status import FINAL_STATES, JobStatus
from ..contract.store import JobDir
from ..launchers.base import LaunchCancelled
from ..plugins import load_plugin
from . import events as ev
from .generation import Generation
from .outcomes import ProcessEvents
from .periodic import WATCHES, Saver, StartupDeadline
from .policy import Fatal, Policy, Stopped, Succeeded
from .scaling import Scaling
from .session import SessionCells
from .stacks import Stacks
from .table import ProcessTable

log = logging.getLogger("jupyter_distrain.supervisor")

TICK_SECONDS = 0.5
START_SECONDS = 60.0  # how long an elastic driver's thread waits for a process start


def _ports(ports: list[int]) -> str:
    return ("port " if len(ports) == 1 else "ports ") + ", ".join(map(str, ports))


class Supervisor:
    """Runs one job: launches its generations, applies events, decides its end."""

    def __init__(
        self,
        job: JobDir,
        inbox: ev.Inbox,
        worker: WorkerCommand,
        counts: Callable[[], tuple[int, int]] = lambda: (0, 0),
        publish: Callable[[dict[str, Any]], None] = lambda state: None,
        plugins: Callable[[str, str], type] = load_plugin,
        isolation_warning: str | None = None,
    ):
        """``counts``, ``publish``: the channels' metrics counts and status answer;
        ``plugins`` finds plugins; ``isolation_warning``: why the job is not isolated."""
        self.job = job
        self.spec = job.read_spec()
        self.inbox = inbox
        self.worker = worker
        self.counts = counts
        self.publish = publish
        self.plugins = plugins
        self.isolation_warning = isolation_warning
        self.status = JobStatus(
            backend=self.spec.backend,
            launcher=self.spec.launcher,
            workers=self.spec.workers,
            supervisor_pid=os.getpid(),
            created=time.time(),
        )
        self.gen: Generation | None = None
        self.stopping = False  # every process is being stopped: exits decide nothing
        self.dirty = False  # live metrics changed since the last save
        self.scaling = Scaling(self)
        self.processes = ProcessEvents(self)
        self.startup = StartupDeadline(self)
        self.stacks = Stacks(self)
        self.session = SessionCells(self)
        self.policy = Policy(self)  # what becomes of the job: decided there only
        self.duties = [self.startup, self.stacks, self.session, *(w(self) for w in WATCHES)]
        self.duties.append(Saver(self))  # last: it saves what the others changed
        self._loop_thread = threading.get_ident()
        # one dispatch: each part says what it does with its events (handlers())
        self._handlers: dict[type, Callable[[Any], Any]] = {
            **self.processes.handlers(),
            **self.scaling.handlers(),
            **self.stacks.handlers(),
            **self.session.handlers(),
            ev.StopRequested: lambda e: self.policy.decide(Stopped(e.reason)),
            ev.StopProcesses: lambda e: self.stop_processes(e.ids),
            ev.StartProcess: lambda e: self.start_process(e.proc),
            ev.BackendDone: lambda e: self.on_backend_done(e.error),
        }

    @property
    def table(self) -> ProcessTable:
        return self.gen.table if self.gen is not None else ProcessTable()

    def run(self) -> None:
        """Launch, then apply events until the job ends; every process is gone after."""
        self._loop_thread = threading.get_ident()
        try:
            self.launch()
            while not self.status.done:
                launching = self.gen is not None and self.gen.launching
                event = self.inbox.next(0 if launching else TICK_SECONDS)
                if event is not None:
                    self.dispatch(event)
                if launching and not self.stopping:
                    self.start_next()
                now = time.monotonic()
                for duty in self.duties:
                    if not self.status.done:
                        duty.tick(now)
        except Exception as exc:
            log.exception("supervisor failed")
            self.policy.decide(Fatal(f"{type(exc).__name__}: {exc}"))
        finally:
            self.shutdown()

    def dispatch(self, event: Any) -> None:
        if isinstance(event, ev.Request):
            try:
                event.future.set_result(self.apply(event.event))
            except Exception as exc:  # the asker gets it; the loop goes on
                event.future.set_exception(exc)
            return
        self.apply(event)

    def apply(self, event: Any) -> Any:
        return self._handlers[type(event)](event)

    # --- the job host (what a backend's driver may call, from any thread) -----------
    def start_process(self, proc: ProcessSpec) -> LaunchedProcess:
        if threading.get_ident() != self._loop_thread:
            return self.inbox.ask(ev.StartProcess(proc), START_SECONDS)
        if self.stopping or self.gen is None:
            raise RuntimeError(f"not starting {proc.id}: the job is ending")
        handle = self.gen.start(proc)
        self.save()
        return handle

    def backend_done(self, error: str | None) -> None:
        self.inbox.post(ev.BackendDone(error))

    def snapshot(self) -> JobStatus:
        self.status.processes = self.table.rows()
        self.status.helpers = self.table.helper_rows()
        self.status.generation = self.gen.number if self.gen is not None else 0
        self.status.metrics_records, self.status.metrics_rejected = self.counts()
        self.status.backend_info = self.gen.info if self.gen is not None else {}
        return self.status

    def save(self) -> None:
        if self.gen is not None:  # what the launcher found for the user (refused files)
            for text in self.gen.launcher.take_warnings():
                self.warn(text)
        self.dirty = False
        self.table.take_late_reports()
        status = self.snapshot()
        self.job.write_state(status)
        self.publish(status.to_dict())

    def set_state(self, state: str, **event: Any) -> None:
        self.status.state = state
        if state in FINAL_STATES:
            self.status.ended = time.time()
            self.stacks.abandon("the job has ended")
        log.info("job %s -> %s %s", self.job.id, state, event or "")
        self.job.append_event("state", state=state, **event)
        self.save()

    # --- generations ------------------------------------------------------------------
    def launch(self) -> None:
        number = self.gen.number + 1 if self.gen is not None else 0
        self.set_state("launching", generation=number, workers=self.spec.workers)
        self.startup.restart()
        self.gen = Generation(
            number, self.spec, self.job, self.worker, self.inbox.post, self.plugins
        )
        self.gen.launcher.on_progress(self.launch_progress)
        on_hosts = self.gen.launcher.kind.runs_on_other_hosts(self.spec)
        unsafe = self.gen.backend.needs_isolation(on_hosts)
        if unsafe and self.isolation_warning:
            self.policy.decide(Fatal(f"not started: {self.isolation_warning}, and {unsafe}"))
            return
        try:
            plan = self.gen.prepare()
        except LaunchCancelled:  # the stop asked meanwhile is next in the inbox
            log.info("launch given up: a stop was asked while it waited")
            return
        if self.isolation_warning and plan.ports:
            exposed = "; ".join(f"{what} on {_ports(p)}" for what, p in plan.ports.items())
            reach = self.gen.launcher.kind.reachable_by(self.spec)
            text = f"{self.isolation_warning}: reachable by {reach}: {exposed}"
            if text not in self.status.warnings:  # once, not once per generation
                self.warn(text)
        self.save()

    def launch_progress(self, text: str) -> bool:
        """A launcher's line while it waits to place the job (a cluster's queue): shown at
        once, and ``--timeout`` counts from it ("": no line); False once a stop was asked."""
        if text:
            self.warn(text)
            self.startup.restart()
            self.save()
        return not self.inbox.stop_posted

    def start_next(self) -> None:
        """Start the next process of the launch (one per turn of the loop)."""
        assert self.gen is not None
        self.gen.start_next(self)
        self.dirty = True

    def warn(self, text: str) -> None:
        """A warning the cell prints once (and the store keeps)."""
        log.warning("%s", text)
        self.status.warnings.append(text)
        self.job.append_event("warning", text=text)
        self.dirty = True

    def resized(self, workers: int) -> None:
        self.spec.workers = self.status.workers = workers
        self.job.write_spec(self.spec)
        self.save()

    def shutdown(self) -> None:
        self.stopping = True
        if self.gen is not None:
            self.gen.stop(0)
        if not self.status.done:
            self.set_state("failed", error=self.status.error or "supervisor ended unexpectedly")
        self.drain_inbox()
        self.save()

    def close(self) -> None:
        """The last save, once the metrics channel has stored everything (last steps)."""
        self.drain_inbox()
        self.save()

    def drain_inbox(self) -> None:
        """After the end: keep the last metrics, refuse what asks for more."""
        for event in self.inbox.drain():
            if isinstance(event, ev.Request | ev.StacksRequested):
                event.future.set_exception(RuntimeError("the job has ended"))
            elif isinstance(event, ev.Metric):
                self.processes.on_metric(event.record, event.received)

    # --- endings ------------------------------------------------------------------------
    def fail(self, error: str, tail: str = "", **event: Any) -> None:
        if self.status.done:
            return
        if self.job.disk_full and "disk full" not in error:
            error = f"{error} (disk full: {self.job.disk_full})"
        log.error("job failed: %s", error)
        self.status.error, self.status.error_tail = error, tail
        self.finish("failed", error=error, **event)

    def stop(self, reason: str) -> None:
        if self.status.done:
            return
        self.job.append_event("stop_requested", reason=reason)
        self.finish("stopped", reason=reason)

    def finish(self, state: str, **event: Any) -> None:
        """Stop every process (SIGTERM, ``--grace``, SIGKILL), then enter ``state``."""
        self.stopping = True
        if self.gen is not None:
            self.gen.stop(self.spec.grace)
        self.set_state(state, **event)

    def on_backend_done(self, error: str | None) -> None:
        """The backend's own driver (elastic Horovod) says the job has ended."""
        if self.status.done or self.stopping:
            return
        self.policy.decide(Fatal(error) if error else Succeeded())

    def stop_processes(self, ids: list[ProcessId]) -> None:
        """Stop some processes; the job's outcome then follows the backend's rules."""
        if {e.record.id for e in self.table.live_members()} <= set(ids):
            self.policy.decide(Stopped("user"))  # nothing would be left running: the whole job
            return
        self.job.append_event("stop_processes", processes=[str(pid) for pid in ids])
        assert self.gen is not None
        self.gen.stop_members(ids, self.spec.grace)
