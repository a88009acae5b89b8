"""The notebook side of a generation's Slurm step: one ``srun`` running :mod:`.task` once
per slot, and a :class:`SlurmProcess` handle per task.

srun carries every task's stdout and stderr back here, each line labelled with the
task's number (``--label``), and hands every task a copy of its stdin (``--input=all``).
:class:`Step` reads both streams: a task's stdout lines go to its process's log, its
marked stderr lines are sorted out (where it is, what it sends back, its end) and the
rest, the host agent's reports, go through a pipe to the task's
:class:`~..agent.client.AgentClient`, which is the same client the ssh and Ray
launchers use. Commands go the other way on srun's stdin, each line prefixed with the
task it is for (:class:`TaskCommands`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..agent.client import HANG_UP_SECONDS, AgentClient, AgentProcess
from ..agent.host import HEARTBEAT_TIMEOUT, MARK
from .task import AGENT_END, ALL, CHUNK, DESCRIBE, END, SENT

log = logging.getLogger(__name__)

LABEL = re.compile(rb" *(\d+): ?(.*)", re.DOTALL)
# srun cuts a labelled line into pieces of this many bytes, each labelled and ended with a
# newline of its own; a line of a multiple of it is followed by an empty piece: a piece
# of exactly this length is always continued by the next piece of the same task
PIECE_BYTES = 1024
# A running agent reports every 2 s: a task silent this long is lost with its node (srun
# itself notices only when Slurm does, after SlurmdTimeout, 300 s by default)
SILENT_SECONDS = HEARTBEAT_TIMEOUT


class Pieces:
    """The lines of one stream of srun's, each task's pieces put back together."""

    def __init__(self) -> None:
        self.pending: dict[int, bytes] = {}
        self.own = b""  # the last line, when it was srun's own

    def line(self, raw: bytes) -> tuple[int, bytes] | None:
        """(task, its whole line with its newline) once ``raw`` completes one; None for a
        piece to be continued, or a line of srun's own (:attr:`own`)."""
        labelled = LABEL.fullmatch(raw)
        self.own = b"" if labelled else raw
        if labelled is None:
            return None
        index, piece = int(labelled[1]), labelled[2].removesuffix(b"\n")
        if len(piece) == PIECE_BYTES:
            self.pending[index] = self.pending.get(index, b"") + piece
            return None
        return index, self.pending.pop(index, b"") + piece + b"\n"


class StepError(RuntimeError):
    """The step did not come up; the message is one line."""


class Step:
    """One srun of ``tasks`` tasks (see the module docstring)."""

    def __init__(
        self,
        argv: list[str],
        tasks: int,
        env: dict[str, str],
        explain: Callable[[], str] = lambda: "",
    ):
        self.tasks = tasks
        self.explain = explain  # what Slurm says of the job, when a task is lost
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        pipes = [os.pipe() for _ in range(tasks)]
        self.reports = [os.fdopen(read, "rb") for read, _ in pipes]
        self._report_fds: list[int | None] = [write for _, write in pipes]
        self.described: dict[int, dict[str, Any]] = {}
        self.chunks: list[queue.SimpleQueue[bytes | str]] = [
            queue.SimpleQueue() for _ in range(tasks)
        ]
        self.said: list[str] = []  # srun's own lines (its errors), a task's before it is up
        self._streams_done = False  # srun's stderr has ended
        self.logs: dict[int, IO[bytes]] = {}
        self._early: dict[int, list[bytes]] = {}  # output before the task's log is known
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self.heard: dict[int, float] = {}  # when each running agent last reported
        self.silent: dict[int, str] = {}  # the tasks given up as lost, and why
        self._readers = [
            threading.Thread(target=self._read_output, name="srun-stdout", daemon=True),
            threading.Thread(target=self._read_reports, name="srun-stderr", daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._watch, name="srun-silence", daemon=True).start()

    # --- what comes back ----------------------------------------------------------------
    def _read_output(self) -> None:
        assert self.popen.stdout is not None
        pieces = Pieces()
        for raw in self.popen.stdout:
            whole = pieces.line(raw)
            if whole is None:
                continue
            index, line = whole
            with self._lock:
                out = self.logs.get(index)
                if out is None:
                    self._early.setdefault(index, []).append(line)
                    continue
            with contextlib.suppress(OSError, ValueError):  # closed with the step meanwhile
                out.write(line)

    def _read_reports(self) -> None:
        assert self.popen.stderr is not None
        pieces = Pieces()
        try:
            for raw in self.popen.stderr:
                whole = pieces.line(raw)
                if whole is not None and whole[0] < self.tasks:
                    self._sort(*whole)
                elif pieces.own.strip():
                    said = pieces.own.decode(errors="replace").strip()
                    log.warning("srun: %s", said)
                    self.said.append(said)
        finally:
            for index in range(self.tasks):
                self._end(index)
            with self._changed:
                self._streams_done = True
                self._changed.notify_all()

    def _sort(self, index: int, line: bytes) -> None:
        """One stderr line of task ``index``: ours, or the agent's (passed on)."""
        text = line.decode(errors="replace")
        if text.startswith(MARK):
            try:
                report = json.loads(text[len(MARK) :])
            except ValueError:
                report = {}
            if DESCRIBE in report:
                with self._changed:
                    self.described[index] = report[DESCRIBE]
                    self._changed.notify_all()
                return
            if CHUNK in report:
                self.chunks[index].put(base64.b64decode(report[CHUNK]))
                return
            if SENT in report:
                self.chunks[index].put(report[SENT])
                return
            if AGENT_END in report:
                self._close_reports(index)
                return
            if END in report:
                self._end(index)
                return
        if index not in self.described and text.strip():  # why it never came up
            self.said.append(f"task {index}: {text.strip()}")
        fd = self._report_fds[index]
        if fd is not None:
            self.heard[index] = time.monotonic()
            with contextlib.suppress(OSError):
                os.write(fd, line)

    def _watch(self) -> None:
        """Give up on a task whose running agent has been silent for
        :data:`SILENT_SECONDS`: its reports end, so its process counts as lost."""
        while self.popen.poll() is None:
            time.sleep(1.0)
            now = time.monotonic()
            for index, heard in list(self.heard.items()):
                if self._report_fds[index] is not None and now - heard > SILENT_SECONDS:
                    self.silent[index] = (
                        f"nothing heard from it for {SILENT_SECONDS:g} s "
                        "(its node, or the network to it, is down)"
                    )
                    log.warning("srun: task %d: %s", index, self.silent[index])
                    self._end(index)

    def _close_reports(self, index: int) -> None:
        """Task ``index``'s agent ended: its client reads to the end of its reports."""
        fd, self._report_fds[index] = self._report_fds[index], None
        if fd is not None:
            os.close(fd)

    def _end(self, index: int) -> None:
        """Task ``index`` ended (or srun did)."""
        self._close_reports(index)
        self.chunks[index].put(f"task {index} ended before it sent everything")

    def describe(self, seconds: float) -> list[dict[str, Any]]:
        """Where each task is, in task order, once all have said so; raises
        :class:`StepError` when srun ends first or ``seconds`` pass."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self.described) == self.tasks or self._streams_done, seconds
            )
            if len(self.described) == self.tasks:
                return [self.described[i] for i in range(self.tasks)]
        self.kill()
        said = "; ".join(self.said[-3:]) or f"no answer within {seconds:g} s"
        raise StepError(f"the Slurm step did not start: {said}")

    def attach_log(self, index: int, log_path: Path) -> None:
        """Task ``index``'s output from now on (and what came before) into ``log_path``."""
        out = open(log_path, "ab", buffering=0)  # noqa: SIM115  closed with the step
        with self._lock:
            for line in self._early.pop(index, []):
                out.write(line)
            self.logs[index] = out

    # --- what goes there ----------------------------------------------------------------
    def send(self, target: int | str, kind: str, payload: bytes = b"") -> None:
        """One command line for task ``target`` (or :data:`~.task.ALL`); ignored once srun
        is gone."""
        line = f"{target} {kind}".encode() + (b" " + payload if payload else b"") + b"\n"
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            assert self.popen.stdin is not None
            self.popen.stdin.write(line)
            self.popen.stdin.flush()

    def receive(self, index: int, timeout: float) -> bytes | str:
        """The next piece of what task ``index`` sends back (bytes), or at its end a
        string: "" when all of it came, else why not."""
        try:
            return self.chunks[index].get(timeout=timeout)
        except queue.Empty:
            return f"nothing from task {index} for {timeout:g} s"

    # --- its end ------------------------------------------------------------------------
    def close_input(self, seconds: float) -> bool:
        """End srun's stdin (every task then ends) and wait for srun; whether it ended."""
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            assert self.popen.stdin is not None
            self.popen.stdin.close()
        try:
            self.popen.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """Kill srun here (Slurm then ends the step's tasks), and wait for its streams."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait()
        for reader in self._readers:
            reader.join(HANG_UP_SECONDS)
        with self._lock:
            for out in self.logs.values():
                out.close()
            self.logs.clear()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


class TaskCommands:
    """The stdin of one task's agent, as :class:`AgentClient` writes it: each line goes
    to srun prefixed with the task's number; closing it hangs the agent up."""

    def __init__(self, step: Step, index: int):
        self.step = step
        self.index = index
        self._pending = b""

    def write(self, data: bytes) -> int:
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            self.step.send(self.index, "agent", line)
        return len(data)

    def flush(self) -> None:
        pass  # every whole line is sent as it is written

    def close(self) -> None:
        self.step.send(self.index, "hangup")


class SlurmProcess(AgentProcess):
    """One process of the job: task ``index`` of the step runs it under the host agent."""

    def __init__(self, step: Step, index: int, host: str, request: dict[str, Any]):
        self.step = step
        self.index = index
        self.host = host
        super().__init__(AgentClient(TaskCommands(step, index), step.reports[index], request))  # type: ignore[arg-type]

    def note_lost(self) -> None:
        """What the step said of the task, and Slurm of the job."""
        said = self.step.silent.get(self.index) or "; ".join(s for s in self.step.said if s)
        said = said or self.agent.said("no exit code")
        with contextlib.suppress(Exception):  # Slurm's word, where it has one
            said = "; ".join(filter(None, [self.step.explain(), said]))
        out = self.step.logs.get(self.index)
        if out is not None:
            with contextlib.suppress(OSError, ValueError):
                out.write(f"\njupyter_distrain: lost task {self.index} on {self.host}: ".encode())
                out.write(f"{said}\n".encode())

    def wait(self) -> int:
        while not self.agent.wait_ended(60.0):
            pass
        return self.final_code()

    def poll(self) -> int | None:
        return self.final_code() if self.agent.ended() else None

    def hang_up(self) -> None:
        self.agent.hang_up()


__all__ = ["ALL", "SlurmProcess", "Step", "StepError", "TaskCommands"]
