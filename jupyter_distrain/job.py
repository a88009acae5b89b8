"""Job: the client handle on a job, built from its directory alone.

Everything here reads the job store or talks to the job's supervisor, so a
handle made in a new kernel (``Job.attach``) behaves like the one that started
the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import psutil

from . import control
from .store import FINAL_STATES, LIVE_PROCESS_STATES, JobDir, find_job_dir, list_job_dirs

STREAM_POLL_SECONDS = 0.1


class JobFailed(RuntimeError):
    """The job ended in ``failed``. Shown in a notebook without a local traceback."""

    def __init__(self, job_id: str, error: str, tail: str = ""):
        super().__init__(f"job {job_id} failed: {error}")
        self.job_id, self.error, self.tail = job_id, error, tail

    def _render_traceback_(self) -> list[str]:  # IPython's hook for custom display
        lines = [f"JobFailed: job {self.job_id} failed: {self.error}"]
        if self.tail:
            lines += ["", *self.tail.splitlines()]
        return lines


class JobInterrupted(Exception):
    """The cell waiting for a job was interrupted (as an async cell); the job was stopped."""

    def __init__(self, job_id: str, state: str):
        super().__init__(f"interrupted: job {job_id} {state}")
        self.job_id, self.state = job_id, state

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: job {self.job_id} {self.state}"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _label(log_path: Path) -> str:
    role, _, index = log_path.stem.rpartition("-")
    return f"[{index}]" if role == "worker" else f"[{log_path.stem}]"


class LogTail:
    """Follows every process log of a job and yields complete new lines."""

    def __init__(self, job: JobDir, from_start: bool = True):
        self.job = job
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        if not from_start:
            for path in self._logs():
                self.offsets[path] = path.stat().st_size

    def _logs(self) -> list[Path]:
        return sorted(p for p in self.job.logs_dir.glob("*-*.log"))

    def read(self) -> list[str]:
        lines: list[str] = []
        for path in self._logs():
            offset = self.offsets.get(path, 0)
            size = path.stat().st_size
            if size <= offset:
                continue
            with open(path, "rb") as f:
                f.seek(offset)
                data = self.partial.pop(path, b"") + f.read(size - offset)
            self.offsets[path] = size
            *complete, rest = data.split(b"\n")
            if rest:
                self.partial[path] = rest
            label = _label(path)
            lines += [f"{label} {line.decode(errors='replace')}" for line in complete]
        return lines

    def flush(self) -> list[str]:
        """Whatever is left without a final newline."""
        lines = [f"{_label(p)} {data.decode(errors='replace')}" for p, data in self.partial.items()]
        self.partial.clear()
        return lines


class Job:
    """A handle on one job: status, logs, stop, wait, result."""

    backend_reason: str = ""  # why submit() chose this backend

    def __init__(self, job_dir: JobDir | str | Path):
        self.dir = job_dir if isinstance(job_dir, JobDir) else JobDir(job_dir)

    @classmethod
    def attach(cls, job_id: str) -> Job:
        """The handle of an existing job, by id or unique id prefix."""
        return cls(find_job_dir(job_id))

    @classmethod
    def list(cls) -> list[Job]:
        return [cls(d) for d in list_job_dirs()]

    @property
    def id(self) -> str:
        return self.dir.id

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.state}>"

    # --- state -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The job's state.json, corrected when its supervisor has vanished."""
        state = self.dir.read_state()
        if state["state"] in FINAL_STATES:
            return state
        ctl = self.dir.read_control()
        if ctl is not None and not _alive(ctl["pid"]):  # started, died without an end
            state = {**state, "state": "failed", "error": "the supervisor died"}
        return state

    @property
    def state(self) -> str:
        return self.status()["state"]

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def supervisor_alive(self) -> bool:
        ctl = self.dir.read_control()
        return ctl is None or _alive(ctl["pid"])  # no control yet: still starting

    def pids(self) -> list[int]:
        """Every pid the job has had: supervisor and processes."""
        state = self.dir.read_state()
        pids = [p["pid"] for p in state.get("processes", []) if p.get("pid")]
        ctl = self.dir.read_control()
        return pids + ([ctl["pid"]] if ctl else [])

    # --- control -----------------------------------------------------------
    def _request(self, op: str, **body: Any) -> dict[str, Any]:
        ctl = self.dir.read_control()
        if ctl is None:
            raise RuntimeError(f"job {self.id} has no supervisor yet")
        return control.request(ctl["host"], ctl["port"], ctl["secret"], {"op": op, **body})

    def stop(self, wait: bool = True) -> str:
        """Stop every process of the job (SIGTERM, then SIGKILL after the grace period)."""
        if not self.done:
            with contextlib.suppress(OSError, RuntimeError):  # gone or not up: status() tells
                self._request("stop", reason="user")
        if wait:
            grace = self.dir.read_spec().grace
            self._wait_final(timeout=grace + 10)
        return self.state

    def scale(self, workers: int) -> None:
        """Restart the job with ``workers`` workers, resuming from a checkpoint.

        The workers are asked to checkpoint (Keras ``fit`` does at its next epoch end);
        the supervisor then relaunches at the new size. Returns once the request is taken.
        """
        reply = self._request("scale", workers=workers)
        if not reply.get("ok"):
            raise ValueError(reply.get("error", "scale refused"))

    def stop_processes(self, labels: list[str], wait: bool = True) -> None:
        """Stop some of the job's processes (``"worker-1"``, ...); all of them stops the job."""
        if not self.done:
            with contextlib.suppress(OSError, RuntimeError):
                self._request("stop_processes", processes=labels)
        if wait:
            deadline = time.monotonic() + self.dir.read_spec().grace + 10
            while time.monotonic() < deadline and not self.done:
                live = {
                    f"{p['role']}-{p['index']}"
                    for p in self.status()["processes"]
                    if p["state"] in LIVE_PROCESS_STATES
                }
                if not live & set(labels):
                    break
                time.sleep(STREAM_POLL_SECONDS)

    def _wait_final(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
            time.sleep(STREAM_POLL_SECONDS)

    def wait(
        self,
        timeout: float | None = None,
        stream: bool = True,
        out: TextIO | None = None,
        from_start: bool = True,
        stop_on_interrupt: bool = True,
        on_tick: Callable[[], None] | None = None,
    ) -> str:
        """Wait for the job to end, printing every process's output with its rank.

        Interrupting the wait (Ctrl-C, the kernel's interrupt) stops the job, unless
        ``stop_on_interrupt`` is false. ``on_tick`` is called on every poll (a view's
        refresh). Returns the final state; raises :class:`JobFailed` when it failed.
        """
        out = out or sys.stdout
        try:
            for _ in self._follow(timeout, stream, out, from_start, on_tick):
                time.sleep(STREAM_POLL_SECONDS)
        except KeyboardInterrupt:
            self._interrupted(out, stop_on_interrupt)
            raise
        return self._outcome()

    async def wait_async(self, stop_on_interrupt: bool = True, **options: Any) -> str:
        """:meth:`wait` (same options) for an event loop: the loop stays free between
        polls, so a kernel handles widget events (the Stop button) while a cell waits."""
        out = options.pop("out", None) or sys.stdout
        steps = self._follow(
            options.get("timeout"),
            options.get("stream", True),
            out,
            options.get("from_start", True),
            options.get("on_tick"),
        )
        try:
            for _ in steps:
                await asyncio.sleep(STREAM_POLL_SECONDS)
        except KeyboardInterrupt:
            self._interrupted(out, stop_on_interrupt)
            raise
        except asyncio.CancelledError:  # how a kernel interrupts an async cell
            self._interrupted(out, stop_on_interrupt)
            if not stop_on_interrupt:
                raise
            # a plain exception, so the cell shows one line and "Run All" stops here
            raise JobInterrupted(self.id, self.state) from None
        return self._outcome()

    def _follow(
        self,
        timeout: float | None,
        stream: bool,
        out: TextIO,
        from_start: bool,
        on_tick: Callable[[], None] | None,
    ) -> Iterator[None]:
        """Print new log lines and tick until the job ends; yields between polls."""
        tail = LogTail(self.dir, from_start=from_start) if stream else None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = self.done  # read before the logs, so no line is missed at the end
            if tail is not None:
                for line in tail.read():
                    print(line, file=out, flush=True)
            if on_tick is not None:
                on_tick()
            if done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
            yield
        if tail is not None:
            for line in tail.flush():
                print(line, file=out, flush=True)

    def _interrupted(self, out: TextIO, stop: bool) -> None:
        if not stop:
            return
        print(f"Interrupted: stopping job {self.id} ...", file=out, flush=True)
        state = self.stop()
        print(f"Job {self.id} {state}.", file=out, flush=True)

    def _outcome(self) -> str:
        status = self.status()
        if status["state"] == "failed":
            raise JobFailed(
                self.id, status.get("error") or "unknown error", status.get("error_tail", "")
            )
        return status["state"]

    # --- output ------------------------------------------------------------
    def logs(self, rank: int | None = None, role: str = "worker") -> str:
        """The full log of one process, or of every process with rank labels."""
        if rank is not None:
            path = self.dir.log_file(role, rank)
            if not path.exists():
                raise KeyError(f"job {self.id} has no log for {role} {rank}")
            return path.read_text(errors="replace")
        tail = LogTail(self.dir)
        return "\n".join(tail.read() + tail.flush())

    def result(self) -> Any:
        """The value rank 0 bound to ``result`` (jobs started with ``--out``)."""
        try:
            with open(self.dir.result_file, "rb") as f:
                stored = pickle.load(f)
        except FileNotFoundError:
            return None
        return stored["value"]
