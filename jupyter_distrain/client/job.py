"""Job: the client handle on a job, built from its directory alone.

Everything here reads the job store or talks to the job's supervisor, so a
handle made in a new kernel (``Job.attach``) behaves like the one that started
the job. A Job neither prints nor decides what an interrupt means: following a
job's output in a cell is :mod:`jupyter_distrain.client.follow`.

Design decision
---------------

- **Failures are shown without a local traceback**: `JobFailed` implements
  IPython's `_render_traceback_`, so the cell shows "rank 1 failed first (exit
  code 1)" and the end of that rank's log (its Python traceback, which starts
  in `train.py` at the cell's own line numbers because the bootstrap compiles
  the file under its real path and drops its own frame). Bad input is a
  `SpecError`, turned into IPython's `UsageError`: one line, no traceback.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..contract import control
from ..contract.cellcheck import resizes_in_place
from ..contract.process import (
    ProcessId,
    scale_request,
    stacks_request,
    stop_processes_request,
    stop_request,
)
from ..contract.spec import JobSpec
from ..contract.stacks import ANSWER_SECONDS as STACKS_ANSWER_SECONDS
from ..contract.stacks import NATIVE_SECONDS, StacksReport
from ..contract.status import JobStatus
from ..contract.store import JobDir, UnreadableSpec, find_job_dir, list_job_dirs
from ..plugins import launcher_kind
from ..timing import poll_until
from .output import LogTail

POLL_SECONDS = 0.1
NEVER_STARTED = "its submit was interrupted before a supervisor started; nothing ran"


class NoStacks(RuntimeError):
    """An ended job that kept no stacks."""


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


def outcome(job_id: str, status: JobStatus) -> str:
    """A final status's state; :class:`JobFailed` (error and log tail) when it failed."""
    if status.state == "failed":
        raise JobFailed(job_id, status.error or "unknown error", status.error_tail)
    return status.state


class Job:
    """A handle on one job: status, logs, stop, scale, wait, result."""

    def __init__(
        self, job_dir: JobDir | str | Path, backend_reason: str = "", notes: list[str] | None = None
    ):
        self.dir = job_dir if isinstance(job_dir, JobDir) else JobDir(job_dir)
        self.backend_reason = backend_reason  # why submit() chose the backend ("" if unknown)
        self.notes = notes or []  # what submit() chose for the user, said once in the cell

    @classmethod
    def attach(cls, job_id: str) -> Job:
        """The handle of an existing job, by id or unique id prefix."""
        return cls(find_job_dir(job_id))

    @classmethod
    def list(cls) -> list[Job]:
        """Every job under the jobs root, oldest first."""
        return [cls(d) for d in list_job_dirs()]

    @property
    def id(self) -> str:
        return self.dir.id

    @property
    def spec(self) -> JobSpec:
        """The job's spec as stored (its backend resolved; its worker count as last scaled).
        Raises :class:`UnreadableSpec` for a damaged spec.json."""
        return self.dir.read_spec()

    def listed(self) -> tuple[JobStatus, JobSpec | None]:
        """The status and spec a listing shows: a job whose spec.json is damaged is listed
        as ``unknown``, with why (one bad file never breaks a listing)."""
        status = self.status()
        try:
            return status, self.spec
        except UnreadableSpec as exc:
            return dataclasses.replace(status, state="unknown", error=str(exc)), None

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.state}>"

    # --- state -------------------------------------------------------------
    def status(self) -> JobStatus:
        """The job's state.json, corrected to ``failed`` (its live rows ``lost``) when its
        supervisor has vanished without writing a final state. Liveness is the
        supervisor's lock on the job directory: exact, whatever happened to its pid."""
        status = self.dir.read_state()
        if not status.done and self.dir.supervisor_alive() is False:
            return status.lost("the supervisor died")  # died without writing an end
        if not status.done and self.dir.never_started():
            return status.lost(NEVER_STARTED)
        return status

    @property
    def state(self) -> str:
        return self.status().state

    @property
    def done(self) -> bool:
        return self.status().done

    def pids(self) -> list[int]:
        """Every pid the job has had: its processes, helpers, the supervisor's warden and
        the supervisor (last)."""
        ctl = self.dir.read_control()
        own = [ctl.warden_pid, ctl.pid] if ctl is not None else []
        return self.dir.read_state().pids() + [pid for pid in own if pid]

    # --- control -----------------------------------------------------------
    def request(self, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """Send one control request to the job's supervisor and return its reply
        (``OSError`` when unreachable, ``RuntimeError`` before it has started)."""
        ctl = self.dir.read_control()
        if ctl is None:
            raise RuntimeError(f"job {self.id} has no supervisor yet")
        return control.request(ctl.address, ctl.secret, body, timeout)

    def tell(self, body: dict[str, Any]) -> None:
        """Send a request that may find the job ended or not up yet: status() tells. A
        request the supervisor did not take in (every connection slot busy) is sent
        again until a slot frees: a busy slot is held for at most one request's time."""

        def taken() -> bool:
            if self.done:
                return True
            try:
                reply = self.request(body)
            except (ConnectionResetError, BrokenPipeError):  # refused: every slot busy
                return False
            except (OSError, RuntimeError):  # ended, or not up yet: status() tells
                return True
            return reply.get("error") != control.NO_REPLY

        poll_until(taken, control.READ_TIMEOUT_SECONDS + 2, POLL_SECONDS * 2)

    def stop(self, wait: bool = True) -> str:
        """Stop every process of the job (SIGTERM, then SIGKILL after the grace period);
        with ``wait``, until the job has ended. Returns the job's state."""
        self.tell(stop_request("user"))
        status = self.status()
        if self.dir.supervisor_alive() is False:  # nobody else will: stop what it recorded
            launcher_kind(self.spec.launcher).stop_lost(status)
        if wait:
            return self._final_status(self.spec.grace + 10).state
        return status.state

    def stacks(self, native: bool = False) -> StacksReport:
        """Every live process's Python stacks, taken now without stopping the job (each
        thread's, grouped by :meth:`StacksReport.text`); kept in the job's
        ``logs/stacks/``; ``native``: with each process's native frames too (``py-spy
        dump --native``, where installed: seconds per process). Raises ``RuntimeError``
        (one line) when the job has no running process to ask."""
        if self.done:
            raise RuntimeError(f"job {self.id} has ended ({self.state}): no process to ask")
        try:
            wait = STACKS_ANSWER_SECONDS + (NATIVE_SECONDS if native else 0) + 5
            reply = self.request(stacks_request(native), timeout=wait)
        except OSError as exc:
            raise RuntimeError(f"cannot reach job {self.id}'s supervisor: {exc}") from None
        if "file" not in reply:
            raise RuntimeError(f"no stacks from job {self.id}: {reply.get('error', reply)}")
        path = self.dir.stacks_dir / Path(str(reply["file"])).name
        return StacksReport.from_dict(json.loads(path.read_text()))

    def kept_stacks(self) -> list[StacksReport]:
        """The stacks taken while the job ran (on request or at a stall), oldest first."""
        return self.dir.read_stacks()

    def latest_stacks(self, native: bool = False) -> tuple[StacksReport, bool]:
        """What every front-end shows: the stacks taken now while the job runs, else the
        last ones taken while it ran; with whether they are those kept. Raises
        :class:`NoStacks` for an ended job that kept none, ``RuntimeError`` when the
        running job's processes cannot be asked."""
        if not self.done:
            return self.stacks(native), False
        kept = self.kept_stacks()
        if not kept:
            raise NoStacks(
                f"job {self.id} has ended ({self.state}); no stacks were taken while it ran"
            )
        return kept[-1], True

    def scale(self, workers: int) -> None:
        """Resize the job to ``workers`` workers: in place for a Horovod elastic program,
        else by restarting it from a checkpoint.

        For a restart the workers are asked to checkpoint (Keras ``fit`` does at its next
        epoch end); the supervisor then relaunches at the new size. Returns once the
        request is taken.
        """
        reply = self.request(scale_request(workers))
        if not reply.get("ok"):
            raise ValueError(reply.get("error", "scale refused"))

    @property
    def scaling_mode(self) -> str:
        """How :meth:`scale` resizes this job, in words: "in place" (Horovod elastic) or
        "at the next checkpoint"."""
        return "in place" if resizes_in_place(self.spec) else "at the next checkpoint"

    def stop_processes(self, processes: Iterable[ProcessId | str], wait: bool = True) -> None:
        """Stop some of the job's processes (``ProcessId("worker", 1)`` or ``"worker-1"``);
        all of them stops the job. With ``wait``, until those processes have ended."""
        wanted = {p if isinstance(p, ProcessId) else ProcessId.parse(p) for p in processes}
        self.tell(stop_processes_request(sorted(wanted)))
        if wait:
            poll_until(lambda: self._ended(wanted), self.spec.grace + 10, POLL_SECONDS)

    def _ended(self, processes: set[ProcessId]) -> bool:
        status = self.status()
        return status.done or not any(p.live and p.id in processes for p in status.processes)

    def _final_or_none(self) -> JobStatus | None:
        status = self.status()
        return status if status.done else None

    def _final_status(self, timeout: float | None) -> JobStatus:
        status = poll_until(self._final_or_none, timeout, POLL_SECONDS)
        if status is None:
            raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
        return status

    def wait(self, timeout: float | None = None) -> str:
        """Wait (silently) for the job to end and return its final state.

        Raises :class:`JobFailed` when it failed, ``TimeoutError`` after ``timeout``
        seconds. To stream the output, or stop the job on Ctrl-C, use
        :func:`jupyter_distrain.client.follow.follow`.
        """
        return outcome(self.id, self._final_status(timeout))

    # --- output ------------------------------------------------------------
    def logs(self, process: ProcessId | None = None) -> str:
        """The full log of one process, or of every process with its label on each line."""
        if process is not None:
            path = self.dir.log_file(process)
            if not path.exists():
                raise KeyError(f"job {self.id} has no log for {process.role} {process.index}")
            return path.read_text(errors="replace")
        tail = LogTail(self.dir)
        return "\n".join(tail.read() + tail.flush())

    def result(self) -> Any:
        """The value rank 0 bound to ``result`` (jobs started with ``--out``)."""
        stored = self.dir.check_private().read_result()
        return None if stored is None else stored["value"]
