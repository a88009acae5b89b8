"""What a cell shows of its processes' output. The logs on disk keep every byte; the
cell gets lines a person can read:

- a line with carriage returns or backspaces (Keras's progress bar redraws itself
  that way, on every rank) is shown as a terminal would leave it: the bar's last
  state, once per epoch and rank, with its rank label intact;
- TensorFlow's and absl's own log lines (oneDNN, cpu_feature_guard, the same on
  every rank) are shown once: a line whose text, less its timestamp and pid, was
  shown before (from any rank) is left out.

``all_output`` shows everything as written.
"""

from __future__ import annotations

import re

# TensorFlow's C++ logging, absl/glog's format, Python-side framework warnings, and
# the continuation line of cpu_feature_guard's message
_FRAMEWORK_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+\] "
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+\] "
    r"|(?:WARNING|INFO):(?:tensorflow|absl|root):"
    r"|To enable the following instructions: )"
)
_TIMESTAMP = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: |^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ "
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
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

    def line(self, text: str) -> str | None:
        """What to print for one line of a process's output; None: nothing."""
        if self.all_output:
            return text
        shown = as_terminal_shows(text)
        if not shown.strip() and text.strip():
            return None  # only control characters
        if _FRAMEWORK_LINE.match(shown):
            key = _TIMESTAMP.sub(r"\1", shown)
            if key in self._shown:
                return None
            if len(self._shown) < MAX_REMEMBERED:
                self._shown.add(key)
        return shown
