"""The supervisor: one detached process per job.

It owns the launcher and the backend, runs the job's state machine, serves the
control channel and writes the job store. It outlives the kernel that started
it (own session), and its workers die with it (PR_SET_PDEATHSIG), so a job
never leaves processes behind.

Run as ``python -m jupyter_distrain.supervisor JOB_DIR``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

import psutil

from . import control, metrics
from .backends.base import Backend
from .instrument import CHECKPOINT_EXIT
from .launchers.base import LaunchedProcess, Launcher, ProcessSpec, tree_rss
from .plugins import BACKENDS, LAUNCHERS, load_plugin
from .store import FINAL_STATES, JobDir, ProcessRecord

log = logging.getLogger("jupyter_distrain.supervisor")

PERIODIC_CHECK_SECONDS = 0.5  # startup deadline, memory limits, saving live metrics
REAP_SECONDS = 5.0  # collecting orphans scans /proc: rare work, kept off the hot path
TAIL_LINES = 20
SCALE_TIMEOUT_SECONDS = 600.0  # how long workers may take to reach a checkpoint
_PR_SET_CHILD_SUBREAPER = 36


class Supervisor:
    def __init__(self, job: JobDir):
        self.job = job
        self.spec = job.read_spec()
        self.secret = secrets.token_hex(32)
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.lock = threading.Lock()
        self.state = "pending"
        self.error: str | None = None
        self.error_tail: str = ""
        self.records: dict[str, ProcessRecord] = {}
        self.launched: dict[str, LaunchedProcess] = {}
        self.started_at = time.time()
        self.running_at: float | None = None
        self.ended_at: float | None = None
        self.stop_requested = False
        self.launcher: Launcher | None = None
        self.backend: Backend | None = None
        self.collector: metrics.Collector | None = None
        self.worker_env: dict[str, str] = {}
        self.generation = 0
        self.scale_to: int | None = None
        self.scale_deadline = 0.0
        self.startup_deadline = 0.0
        self.dirty = False  # live metrics changed since the last save

    # --- store -----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "state": self.state,
                "backend": self.spec.backend,
                "launcher": self.spec.launcher,
                "workers": self.spec.workers,
                "generation": self.generation,
                "scaling_to": self.scale_to,
                "supervisor_pid": os.getpid(),
                "created": self.started_at,
                "running_at": self.running_at,
                "ended": self.ended_at,
                "error": self.error,
                "error_tail": self.error_tail,
                "processes": [asdict(r) for r in self.records.values()],
                "metrics_records": self.collector.records if self.collector else 0,
                "metrics_rejected": self.collector.rejected if self.collector else 0,
                **(self.backend.info() if self.backend and self.records else {}),
            }

    def save(self) -> None:
        self.dirty = False
        self.job.write_state(self.snapshot())

    def set_state(self, state: str, **event: Any) -> None:
        with self.lock:
            self.state = state
            if state in FINAL_STATES:
                self.ended_at = time.time()
        log.info("job %s -> %s %s", self.job.id, state, event or "")
        self.job.append_event("state", state=state, **event)
        self.save()

    # --- control channel (runs in server threads) ---------------------------
    def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        op = body.get("op")
        if op == "status":
            return self.snapshot()
        if op == "scale":
            workers = body.get("workers")
            if not isinstance(workers, int) or workers < 1:
                raise ValueError(f"scale needs a number of workers >= 1, got {workers!r}")
            if self.state != "running":
                raise ValueError(f"cannot scale a job that is {self.state}")
        if op in ("stop", "stop_processes", "hello", "bye", "scale"):
            self.events.put((op, body))
            return {}
        raise ValueError(f"unknown op {op!r}")

    # --- lifecycle ---------------------------------------------------------
    def run(self) -> int:
        become_subreaper()
        server = control.ControlServer(self.secret, self.handle).start()
        self.collector = metrics.Collector(
            self.secret, self.job.metrics_file, self.on_metric, host=server.host
        ).start()
        self.job.write_control(server.host, server.port, self.secret, os.getpid())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.events.put(("stop", {"reason": "signal"})))
        self.worker_env = {
            "JUPYTER_DISTRAIN_JOB_DIR": str(self.job.path),
            "JUPYTER_DISTRAIN_CONTROL": f"{server.host}:{server.port}",
            "JUPYTER_DISTRAIN_METRICS": self.collector.address,
            "JUPYTER_DISTRAIN_SECRET": self.secret,
            "JUPYTER_DISTRAIN_BACKEND": self.spec.backend,
            "JUPYTER_DISTRAIN_OUT": self.spec.out or "",
            "PYTHONUNBUFFERED": "1",
        }
        if self.spec.batch_size:
            self.worker_env["JUPYTER_DISTRAIN_BATCH_SIZE"] = str(self.spec.batch_size)
        try:
            self.launch()
            self.monitor()
        except Exception as exc:
            log.exception("supervisor failed")
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.shutdown()
            self.collector.stop()  # after every process is gone: their last records are in
            self.save()
            server.stop()
        return 0

    def launch(self) -> None:
        self.set_state("launching", generation=self.generation, workers=self.spec.workers)
        self.startup_deadline = time.monotonic() + self.spec.timeout
        self.launcher = load_plugin(LAUNCHERS, self.spec.launcher)(self.spec, self.job)
        self.backend = load_plugin(BACKENDS, self.spec.backend)(self.spec, self.job)
        self.backend.bind(self.start_process, lambda kind, body: self.events.put((kind, body)))
        slots = self.launcher.place(self.backend.slots_needed())
        self.backend.start_services(slots, self.launcher)
        python = self.spec.python or sys.executable
        argv = [python, "-m", "jupyter_distrain.worker"]
        procs = self.backend.plan(slots, argv, dict(self.worker_env))
        for proc in procs:
            for rank in proc.ranks if proc.hosts_ranks else []:  # mpirun's ranks get rows
                self.records[f"worker-{rank}"] = ProcessRecord(
                    "worker",
                    rank,
                    proc.slot.host if proc.slot else "localhost",
                    [rank],
                    log=f"logs/worker-{rank}.log",
                    generation=self.generation,
                )
            self.start_process(proc)
        self.backend.start(argv, dict(self.worker_env))
        self.save()

    def start_process(self, proc: ProcessSpec) -> LaunchedProcess:
        """Launch one process and record it (also called from an elastic driver's threads)."""
        log_path = self.job.log_file(proc.role, proc.index)
        proc.env["JUPYTER_DISTRAIN_ROLE"] = proc.role
        proc.env["JUPYTER_DISTRAIN_INDEX"] = str(proc.index)
        if proc.slot is not None:
            proc.env["JUPYTER_DISTRAIN_ADDRESS"] = proc.slot.address
        assert self.launcher is not None
        with self.lock:
            record = self.records.get(proc.label)
            if record is None or not record.live:  # a new process, or a new one in its slot
                record = ProcessRecord(
                    proc.role,
                    proc.index,
                    proc.slot.host if proc.slot else "localhost",
                    proc.ranks,
                    hosts_ranks=proc.hosts_ranks,
                    generation=self.generation,
                )
                self.records[proc.label] = record
            record.log = str(log_path.relative_to(self.job.path))
            launched = self.launcher.start(proc, log_path)
            self.launched[proc.label] = launched
            record.pid, record.state, record.started = launched.pid, "starting", time.time()
        self.job.append_event("launch", process=proc.label, pid=launched.pid, ranks=proc.ranks)
        threading.Thread(target=self._wait_exit, args=(proc.label, launched), daemon=True).start()
        self.dirty = True
        return launched

    def _wait_exit(self, label: str, launched: LaunchedProcess) -> None:
        code = launched.wait()
        self.events.put(("exit", {"label": label, "code": code, "pid": launched.pid}))

    # --- the state machine ---------------------------------------------------
    def monitor(self) -> None:
        next_check = next_reap = 0.0
        while self.state not in FINAL_STATES:
            try:
                kind, body = self.events.get(timeout=PERIODIC_CHECK_SECONDS)
            except queue.Empty:
                kind, body = "tick", {}
            if kind == "exit":
                self.on_exit(body["label"], body["code"], body["pid"])
            elif kind == "hello":
                self.on_hello(body)
            elif kind == "bye":
                self.on_bye(body)
            elif kind == "stop":
                self.stop(reason=body.get("reason", "requested"))
            elif kind == "stop_processes":
                self.stop_processes(list(body.get("processes", [])))
            elif kind == "scale":
                self.request_scale(int(body["workers"]))
            elif kind == "backend_done":
                self.on_backend_done(body)
            if self.state in FINAL_STATES:
                return
            now = time.monotonic()
            if self.state == "launching" and now > self.startup_deadline:
                missing = [r.label for r in self.members() if r.state in ("pending", "starting")]
                self.fail(
                    f"startup timeout: {', '.join(missing)} did not come up "
                    f"within {self.spec.timeout:g} s"
                )
            elif now >= next_check:
                next_check = now + PERIODIC_CHECK_SECONDS
                if now >= next_reap:
                    next_reap = now + REAP_SECONDS
                    self.reap()
                if self.spec.memory is not None:
                    self.check_memory()
                if self.scale_to is not None and now > self.scale_deadline:
                    self.job.append_event(
                        "scale_failed", reason="the workers did not checkpoint in time"
                    )
                    self.scale_to = None
                    self.dirty = True
                if self.dirty:
                    self.save()

    def on_metric(self, record: dict[str, Any]) -> None:
        """The latest record of a batch from one process (collector thread)."""
        proc = self.records.get(f"{record.get('role')}-{record.get('rank')}")
        if proc is None:
            return
        proc.heartbeat = record.get("time")
        if "step" in record:
            proc.step = record["step"]
            proc.images_per_sec = record.get("images_per_sec", proc.images_per_sec)
            proc.loss = record.get("loss", proc.loss)
            proc.total_steps = record.get("total_steps", proc.total_steps)
        self.dirty = True

    def members(self) -> list[ProcessRecord]:
        """The job's processes that run the bootstrap (every row but mpirun's)."""
        return [r for r in list(self.records.values()) if not r.hosts_ranks]

    def on_hello(self, body: dict[str, Any]) -> None:
        record = self.records.get(f"{body.get('role')}-{body.get('index')}")
        if record is None:
            return
        record.pid = record.pid or body.get("pid")
        record.host = body.get("host", record.host)
        record.address = body.get("address", record.address)
        record.state = "running"
        self.job.append_event("process_up", process=record.label, pid=record.pid)
        if self.state == "launching" and all(r.state == "running" for r in self.members()):
            self.running_at = time.time()
            self.set_state(
                "running", seconds_to_running=round(self.running_at - self.started_at, 3)
            )
        else:
            self.save()

    def on_bye(self, body: dict[str, Any]) -> None:
        """A rank hosted by mpirun reports its exit code before it exits."""
        record = self.records.get(f"{body.get('role')}-{body.get('index')}")
        if record is None or record.label in self.launched or record.pid != body.get("pid"):
            return  # processes we launched ourselves report through wait()
        self.on_process_end(record, int(body.get("code", 1)))

    def on_exit(self, label: str, code: int, pid: int) -> None:
        record = self.records.get(label)
        if record is None or record.pid != pid:
            return  # a process of an earlier generation, already accounted for
        for rank in record.ranks if record.hosts_ranks else []:
            self.record_exit(self.records[f"worker-{rank}"], code)  # ranks that said no bye
        self.on_process_end(record, code)

    def on_process_end(self, record: ProcessRecord, code: int) -> None:
        self.record_exit(record, code)
        if self.stop_requested or self.state in FINAL_STATES:
            return
        if self.scale_to is not None and code == CHECKPOINT_EXIT:
            self.restart(self.scale_to)
            return
        assert self.backend is not None
        outcome = self.backend.outcome(list(self.records.values()), record)
        if outcome is None:
            if code:
                self.job.append_event("process_lost", process=record.label, code=code)
            return
        if outcome.state == "failed":
            culprit = outcome.culprit
            tail = self.log_tail(culprit) if culprit else ""
            self.fail(
                outcome.error or "failed", tail=tail, process=culprit.label if culprit else None
            )
        else:
            if any(r.live for r in self.members()):
                self.job.append_event("finishing", reason=f"{record.label} ended the job")
            self.terminate_all(self.spec.grace)
            self.set_state("succeeded")

    def record_exit(self, record: ProcessRecord, code: int) -> None:
        if not record.live:
            return
        record.exit_code = code
        record.state = "killed" if code < 0 else "exited"
        record.ended = time.time()
        self.job.append_event("exit", process=record.label, code=code)
        self.save()

    def log_tail(self, record: ProcessRecord, lines: int = TAIL_LINES) -> str:
        path = self.job.log_file(record.role, record.index)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 64 * 1024))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_memory(self) -> None:
        """Stop the job when a process's resident set (children included) exceeds --memory."""
        assert self.spec.memory is not None
        limit = self.spec.memory * 2**30
        for record in self.members():
            if not record.live or not record.pid:
                continue
            used = tree_rss(record.pid)
            if used > limit:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
                self.record_exit(record, -signal.SIGKILL)
                name = f"worker {record.index}" if record.role == "worker" else record.describe()
                self.fail(
                    f"{name} exceeded {self.spec.memory:.1f} GiB (resident {used / 2**30:.2f} GiB)",
                    process=record.label,
                )
                return

    def fail(self, error: str, tail: str = "", **event: Any) -> None:
        if self.state in FINAL_STATES:
            return
        log.error("job failed: %s", error)
        with self.lock:
            self.error, self.error_tail = error, tail
        self.terminate_all(self.spec.grace)
        self.set_state("failed", error=error, **event)

    def stop(self, reason: str) -> None:
        self.job.append_event("stop_requested", reason=reason)
        self.terminate_all(self.spec.grace)
        self.set_state("stopped", reason=reason)

    def on_backend_done(self, body: dict[str, Any]) -> None:
        """The backend's own driver (elastic Horovod) says the job has ended."""
        if self.state in FINAL_STATES or self.stop_requested:
            return
        if body.get("error"):
            self.fail(str(body["error"]))
        else:
            self.terminate_all(self.spec.grace)
            self.set_state("succeeded")

    # --- scaling ---------------------------------------------------------------
    def request_scale(self, workers: int) -> None:
        """Ask every process to checkpoint; the job restarts at the new size when they have.
        A backend that can resize in place (elastic Horovod) does so instead."""
        if self.state != "running" or workers == self.spec.workers:
            return
        self.job.append_event("scale_requested", workers=workers, previous=self.spec.workers)
        assert self.backend is not None
        if self.backend.scale_in_place(workers):
            self.spec.workers = workers
            self.job.write_spec(self.spec)
            self.job.append_event("scaled_in_place", workers=workers)
            self.save()
            return
        self.scale_to = workers
        self.scale_deadline = time.monotonic() + SCALE_TIMEOUT_SECONDS
        for record in self.members():
            if record.live and record.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGUSR1)
        self.save()

    def restart(self, workers: int) -> None:
        """Stop the current generation and launch the next one with ``workers`` workers."""
        log.info("restarting with %d workers", workers)
        self.terminate(self.launched_labels(), self.spec.grace)
        kill_descendants()
        self.reap()
        self.drain_exits()
        assert self.backend is not None and self.launcher is not None
        self.backend.stop_services()
        self.launcher.close()
        self.job.append_event(
            "restart",
            generation=self.generation + 1,
            workers=workers,
            previous=[asdict(r) for r in self.records.values()],
        )
        self.generation += 1
        self.spec.workers = workers
        self.job.write_spec(self.spec)
        self.records, self.launched, self.scale_to = {}, {}, None
        self.launch()

    def stop_processes(self, labels: list[str]) -> None:
        """Stop some processes; the job's outcome then follows the backend's rules."""
        live = {r.label for r in self.members() if r.live}
        if live <= set(labels):  # nothing would be left running: stop the job as a whole
            self.stop(reason="user")
            return
        for label in labels:
            if label in self.records:
                self.records[label].stopped = True
        self.job.append_event("stop_processes", processes=labels)
        self.terminate([label for label in labels if label in self.launched], self.spec.grace)

    def alive(self, labels: list[str]) -> list[str]:
        return [label for label in labels if self.launched[label].poll() is None]

    def launched_labels(self) -> list[str]:
        return list(self.launched)

    def terminate(self, labels: list[str], grace: float) -> None:
        """SIGTERM these processes' trees, SIGKILL what is left after ``grace`` s."""
        for label in self.alive(labels):
            self.launched[label].signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive(labels) and time.monotonic() < deadline:
            time.sleep(0.05)
        for label in self.alive(labels):
            log.warning("%s ignored SIGTERM for %.1f s: SIGKILL", label, grace)
            self.launched[label].signal(signal.SIGKILL)
        for label in labels:
            self.launched[label].signal(signal.SIGKILL)  # stragglers that left the group
            self.launched[label].wait()

    def terminate_all(self, grace: float) -> None:
        """Stop every process of the job, and anything else still below the supervisor."""
        self.stop_requested = True
        if self.backend is not None:
            self.backend.stop_services()  # first, so no driver starts anything new
        self.terminate(self.launched_labels(), grace)
        kill_descendants()  # anything that escaped its process group, orphans included
        self.reap()
        self.drain_exits()

    def reap(self) -> None:
        reap_orphans({p.pid for p in list(self.launched.values())})

    def drain_exits(self) -> None:
        """Record the exits the wait threads reported, and anything still unrecorded."""
        for label, launched in list(self.launched.items()):
            code = launched.poll()
            if code is not None:
                self.record_exit(self.records[label], code)
        for record in list(self.records.values()):
            if record.live:
                self.record_exit(record, -signal.SIGKILL)

    def shutdown(self) -> None:
        if self.launched:
            self.terminate_all(0)
        if self.backend is not None:
            self.backend.stop_services()
        if self.launcher is not None:
            self.launcher.close()
        if self.state not in FINAL_STATES:
            self.set_state("failed", error=self.error or "supervisor ended unexpectedly")
        self.save()


def become_subreaper() -> None:
    """Orphans of the job's processes (ranks whose mpirun died) become our children."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def kill_descendants() -> None:
    """SIGKILL every process below the supervisor, whoever started it."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def reap_orphans(known: set[int]) -> None:
    """Collect exited orphans; ``known`` pids are left to their Popen objects."""
    for child in psutil.Process().children():
        if child.pid in known:
            continue
        with contextlib.suppress(ChildProcessError, psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def _setup_logging(job: JobDir) -> None:
    logging.basicConfig(
        filename=job.supervisor_log,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    job = JobDir(argv[0])
    _setup_logging(job)
    log.info("supervisor for %s on %s, pid %d", job.id, socket.gethostname(), os.getpid())
    return Supervisor(job).run()


if __name__ == "__main__":
    sys.exit(main())
