"""Reading files that grow: new complete lines since the last read, and the last N lines.

Logs and ``metrics.jsonl`` are only ever appended to, so a reader keeps an
offset and reads what was added; the end of a large file is read from the end,
never the whole file.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_PARTIAL_BYTES = 1 << 20  # a "line" longer than this (a \r progress bar) is cut into pieces
READ_BYTES = 4 << 20  # the most one read() takes in: a large file is read in pieces
TAIL_BYTES = 64 * 1024


class LineReader:
    """The complete lines appended to one file since the last :meth:`read`."""

    def __init__(self, path: Path, from_start: bool = True, last: int = 0):
        """``from_start`` false: only what is appended from now on, and the ``last``
        complete lines already there (``attach`` shows them, as ``tail -f`` does)."""
        self.path = path
        self.offset = 0
        self.partial = b""
        self.behind = False  # the last read stopped at max_bytes: there is more
        if not from_start:
            self.offset = _start_of_last_lines(path, last)

    def read(self, max_bytes: int = READ_BYTES) -> list[bytes]:
        """New complete lines, from at most ``max_bytes`` more of the file (call again
        while :attr:`behind`: memory stays bounded however large the file is)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(max_bytes)
                self.behind = len(data) == max_bytes
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        *lines, rest = (self.partial + data).split(b"\n")
        if len(rest) > MAX_PARTIAL_BYTES:  # never hold an unbounded partial line
            lines.append(rest)
            rest = b""
        self.partial = rest
        return lines

    def flush(self) -> list[bytes]:
        """What is left without a final newline."""
        rest, self.partial = self.partial, b""
        return [rest] if rest else []


def _start_of_last_lines(path: Path, lines: int, max_bytes: int = TAIL_BYTES) -> int:
    """Where the last ``lines`` complete lines of a file begin (its end for 0; a line
    that started more than ``max_bytes`` from the end is left out)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if not lines:
                return size
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return 0
    cut = data.rfind(b"\n")  # the last complete line's end: a partial one is read later
    for _ in range(lines):
        if cut < 0:
            break
        cut = data.rfind(b"\n", 0, cut)
    if cut < 0:  # fewer lines than asked: from the file's start, or the first whole line
        return start if start == 0 else start + data.find(b"\n") + 1
    return start + cut + 1


def last_lines(path: Path, lines: int, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of a file, reading at most its last ``max_bytes``."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
