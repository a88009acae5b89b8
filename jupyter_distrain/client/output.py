"""What a cell shows of its processes' output. The logs on disk keep every byte; the
cell gets lines a person can read:

- a line with carriage returns or backspaces (Keras's progress bar redraws itself
  that way, on every rank) is shown as a terminal would leave it: the bar's last
  state, once per epoch and rank, with its rank label intact;
- TensorFlow's, absl's and PyTorch's own log lines (oneDNN, cpu_feature_guard, c10d's
  warnings, the same on every rank) are shown once: a line whose text, less its
  timestamp and pid, was shown before (from any rank) is left out.

``all_output`` shows everything as written. :class:`LogTail` reads every log of a job
and gives its new lines so rendered, each with its process's label.

What the cell prints
--------------------

The follow reads each process's log by complete lines and passes each through
`CellOutput`: a line with `\\r` or `\\b` (Keras's progress bar redraws itself that
way on every rank) is shown as a terminal would leave it, so each epoch leaves one
line per rank with its `[rank]` label intact; a TensorFlow/absl log line (C++
logging, glog format, `WARNING:tensorflow:`, cpu_feature_guard's continuation)
whose text less timestamp and pid was shown before, from any rank, is dropped; a
framework warning another thread wrote into the middle of a bar becomes its own
line, and the bar's state it cut is dropped (its final state follows). User lines
are never dropped. `--all-output` prints everything as written; the logs on disk
are never rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path

from ..contract.process import ProcessId
from ..contract.store import JobDir
from ..contract.tail import LineReader

# TensorFlow's C++ logging, absl/glog's format, Python-side framework warnings, and
# the continuation line of cpu_feature_guard's message
_FRAMEWORK_START = (
    r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+\] "
    r"|[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+\] "
    r"|\[[IWEF]\d{4} \d\d:\d\d:[\d.]+ \S+\] "  # PyTorch's c10 logging
    r"|(?:WARNING|INFO):(?:tensorflow|absl|root):"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: )"
)
_FRAMEWORK_LINE = re.compile("^" + _FRAMEWORK_START)
# the timestamp (and glog's pid) of such a line; the severity letter stays
_TIMESTAMP = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: |^\[?([IWEF])\d{4} \d\d:\d\d:[\d.]+(?:\s+\d+)? "
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# a framework message another thread wrote into the middle of a progress bar's line
_GLUED = re.compile("(?<=.)(?=" + _FRAMEWORK_START + ")")
# a Keras progress bar ("7/12 [====>....")
_UNFINISHED_BAR = re.compile(r"^\s*(\d+)/(\d+) \[")
MAX_REMEMBERED = 10_000


def as_terminal_shows(text: str) -> str:
    """The line a terminal is left with after the text's ``\\r`` and ``\\b``."""
    if "\r" not in text and "\b" not in text:
        return text
    line: list[str] = []
    column = 0
    for char in _ANSI.sub("", text):
        if char == "\r":
            column = 0
        elif char == "\b":
            column = max(0, column - 1)
        else:
            if column < len(line):
                line[column] = char
            else:
                line.append(char)
            column += 1
    return "".join(line).rstrip()


class CellOutput:
    """Turns the processes' complete log lines into the lines a cell prints."""

    def __init__(self, all_output: bool = False):
        self.all_output = all_output
        self._shown: set[str] = set()

    def lines(self, text: str) -> list[str]:
        """What to print for one line of a process's output (none, one, or a bar and the
        framework message that was written into it)."""
        if self.all_output:
            return [text]
        shown = as_terminal_shows(text)
        if not shown.strip():
            return [shown] if not text.strip() else []  # blank stays; control chars go
        parts = _GLUED.split(shown) if "\r" in text else [shown]
        if len(parts) > 1 and _unfinished_bar(parts[0]):
            parts = parts[1:]  # the bar's state when the message cut in: its end follows
        if len(parts) > 1:
            parts = [part.rstrip() for part in parts]
        return [part for part in parts if part.strip() and self._new_or_ours(part)]

    def _new_or_ours(self, line: str) -> bool:
        """False for a framework line shown before (from any rank)."""
        if not _FRAMEWORK_LINE.match(line):
            return True
        key = _TIMESTAMP.sub(r"\1", line)
        if key in self._shown:
            return False
        if len(self._shown) < MAX_REMEMBERED:
            self._shown.add(key)
        return True


def _unfinished_bar(line: str) -> bool:
    """A bar's state before its final one: short of its total, or still showing an ETA
    (Keras redraws the last step with its time per step)."""
    match = _UNFINISHED_BAR.match(line)
    return match is not None and (match.group(1) != match.group(2) or "ETA:" in line)


def label(process: ProcessId) -> str:
    """How a process's output lines are prefixed: ``[1]`` for worker 1, ``[ps-0]`` otherwise."""
    return f"[{process.index}]" if process.role == "worker" else f"[{process}]"


class LogTail:
    """Follows every process log of a job: new complete lines, each prefixed by its label,
    as :class:`~jupyter_distrain.client.output.CellOutput` renders them."""

    def __init__(
        self,
        job_dir: JobDir,
        from_start: bool = True,
        all_output: bool = False,
        only: Collection[ProcessId] | None = None,
        last: int = 0,
    ):
        self.dir = job_dir
        self.output = CellOutput(all_output)
        self.only = only
        self.readers: dict[ProcessId, LineReader] = {
            process: LineReader(path, from_start, last) for process, path in self._logs()
        }

    def _logs(self) -> list[tuple[ProcessId, Path]]:
        """The job's logs (``only`` these processes', when given)."""
        logs = self.dir.log_files().items()
        return [(p, path) for p, path in logs if self.only is None or p in self.only]

    def _current(self) -> list[tuple[ProcessId, LineReader]]:
        """A reader per log, in log order; a log that appeared since is read from its start."""
        for process, path in self._logs():
            if process not in self.readers:
                self.readers[process] = LineReader(path)
        return sorted(self.readers.items())

    def read(self) -> list[str]:
        """The complete lines added to any log since the last call."""
        return self._labelled((p, line) for p, reader in self._current() for line in reader.read())

    def flush(self) -> list[str]:
        """Whatever is left without a final newline."""
        readers = sorted(self.readers.items())
        return self._labelled((p, line) for p, reader in readers for line in reader.flush())

    def _labelled(self, lines: Iterable[tuple[ProcessId, bytes]]) -> list[str]:
        shown = []
        for process, line in lines:
            for text in self.output.lines(line.decode(errors="replace")):
                shown.append(f"{label(process)} {text}")
        return shown
