"""Where every process of a job is: the Python stacks a worker answers with when asked,
what the supervisor keeps of them, and the grouped view every front-end shows.

How it works
------------

- **Asked by a signal, answered on the control channel.** The supervisor sends
  ``STACKS_SIGNAL`` through each live process's launcher handle (so it reaches local,
  pooled, ssh, Ray and Slurm processes alike, as a checkpoint request does). The worker
  registered :mod:`faulthandler` on it, writing into a pipe: the dump is taken in the
  signal handler, without the GIL, while the program keeps running, even when its main
  thread is blocked in a collective. A thread of the worker (``worker/stacks.py``) reads
  the pipe, adds the thread names and source lines, and sends a :class:`ProcessStacks`
  as an ``Op.STACKS_TAKEN`` control request. A process that does not answer within
  ``ANSWER_SECONDS`` is named as such (stopped, or its interpreter held by native code).
- **Kept.** Each collection is a :class:`StacksReport`, written by the supervisor as
  ``stacks/NNN-REASON.json`` and ``.txt`` in the job directory (``request``: someone
  asked; ``stall``: ``--stall-timeout`` fired, taken once per stall).
- **Grouped.** Processes whose main threads stand at the same frames form one group;
  the smallest groups (the odd ones out) come first: ``rank 1: next ← train.py:17``
  above ``ranks 0, 2, 3: all_reduce ← train.py:42``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

STACKS_SIGNAL = signal.SIGUSR2
ANSWER_SECONDS = 5.0  # how long a collection waits for the processes' answers
NATIVE_SECONDS = 10.0  # and for py-spy's reading of one process (``--native``), besides
MAX_FRAMES = 40  # innermost frames kept per thread
MAX_CODE = 160  # characters of a source line kept
# the worker's own threads: not the user's program, left out of the grouped view
OUR_THREADS = frozenset({"metrics-reporter", "distrain-stacks"})

_LIBRARY = re.compile(r".*/(?:site-packages|dist-packages)/|.*/lib/python3\.\d+/")


def short_path(path: str, *roots: str) -> str:
    """A frame's file as the views show it: relative to site-packages
    (``torch/distributed/...``) or to the standard library, else to the first of ``roots``
    it lies under (the job directory: ``train.py``), else whole; the same file reads the
    same on every host."""
    shorter = _LIBRARY.sub("", path, count=1)
    if shorter != path:
        return shorter
    for root in roots:
        if root and path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1 :]
    return path


@dataclass
class Frame:
    file: str
    line: int
    function: str
    code: str = ""  # the source line, stripped
    own: bool = False  # in the job's directory: the program's own file (train.py)

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class ThreadStack:
    name: str
    frames: list[Frame]  # outermost first, as a traceback
    main: bool = False
    ours: bool = False  # a thread of the worker itself (metrics, this answer)

    def key(self) -> tuple[tuple[str, int, str], ...]:
        return tuple((f.file, f.line, f.function) for f in self.frames)

    def summary(self) -> str:
        """``all_reduce ← train.py:42  dist.all_reduce(t)``: the innermost function and
        the innermost line of the program's own files (where none: the innermost frame)."""
        if not self.frames:
            return "no Python frame"
        inner = self.frames[-1]
        own = [f for f in self.frames if f.own]
        line = own[-1] if own else inner
        code = f"  {line.code}" if line.code else ""
        if not own:
            return f"{inner.where()} in {inner.function}"
        if line is inner:
            return f"{line.where()} in {line.function}{code}"
        return f"{inner.function} ← {line.where()}{code}"


@dataclass
class ProcessStacks:
    """One process's answer (or its lack of one: ``error``)."""

    process: str  # its ProcessId, "worker-0"
    name: str = ""  # how messages name it: "rank 0", "ps 1"
    host: str = ""
    pid: int = 0
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""
    native: str = ""  # py-spy's dump, native frames included (asked with --native)

    @property
    def label(self) -> str:
        """How the views name it: its name, else its id."""
        return self.name or self.process

    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)

    def key(self) -> tuple[Any, ...]:
        main = self.main_thread()
        return main.key() if main is not None else ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fitted(self, max_bytes: int) -> dict[str, Any]:
        """:meth:`to_dict` within ``max_bytes`` of JSON (a control request's line): the
        other threads' frames are cut to their innermost few, then left out, then the main
        thread's outer frames, until it fits."""
        steps = [
            lambda t: t,
            lambda t: t if t.main else dataclasses.replace(t, frames=t.frames[-5:]),
            lambda t: t if t.main else dataclasses.replace(t, frames=[]),
            lambda t: dataclasses.replace(t, frames=t.frames[-10:]) if t.main else None,
        ]
        for step in steps:
            threads = [t for t in map(step, self.threads) if t is not None]
            data = dataclasses.asdict(dataclasses.replace(self, threads=threads))
            if len(json.dumps(data)) <= max_bytes:
                break
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessStacks:
        """Read an answer; what a process sends is checked, not trusted (a bad field raises
        ``ValueError``)."""
        try:
            threads = [
                ThreadStack(
                    str(t["name"])[:100],
                    [
                        Frame(
                            str(f["file"])[:500],
                            int(f["line"]),
                            str(f["function"])[:200],
                            str(f.get("code", ""))[:MAX_CODE],
                            bool(f.get("own")),
                        )
                        for f in t["frames"][-MAX_FRAMES:]
                    ],
                    bool(t.get("main")),
                    bool(t.get("ours")),
                )
                for t in data.get("threads", [])
            ]
            return cls(
                str(data["process"]),
                str(data.get("name", "")),
                str(data.get("host", "")),
                int(data.get("pid", 0)),
                threads,
                str(data.get("error", "")),
                str(data.get("native", "")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a stacks answer: {exc!r}") from exc


def names_text(names: list[str]) -> str:
    """``ranks 0, 2, 3`` for ranks, else the names joined."""
    if len(names) > 1 and all(n.startswith("rank ") for n in names):
        return "ranks " + ", ".join(n.removeprefix("rank ") for n in names)
    return ", ".join(names)


@dataclass
class StackGroup:
    """Processes whose main threads stand at the same frames."""

    processes: list[ProcessStacks]

    @property
    def names(self) -> list[str]:
        return [p.label for p in self.processes]

    @property
    def stack(self) -> ThreadStack | None:
        return self.processes[0].main_thread()

    def headline(self) -> str:
        stack = self.stack
        return f"{names_text(self.names)}: {stack.summary() if stack else 'no main thread'}"

    def to_dict(self) -> dict[str, Any]:
        stack = self.stack
        return {
            "processes": [p.process for p in self.processes],
            "names": self.names,
            "headline": self.headline(),
            "frames": [dataclasses.asdict(f) for f in stack.frames] if stack else [],
        }


def _native_lines(proc: ProcessStacks) -> list[str]:
    if not proc.native:
        return []
    head = f"      {proc.label}, native (py-spy):"
    return [head, *(f"        {line}" for line in proc.native.splitlines())]


@dataclass
class StacksReport:
    """One collection: every live process's stacks, or why it gave none."""

    job: str
    reason: str  # "request" or "stall"
    taken: float = field(default_factory=time.time)
    processes: list[ProcessStacks] = field(default_factory=list)

    def answered(self) -> list[ProcessStacks]:
        return [p for p in self.processes if not p.error]

    def groups(self) -> list[StackGroup]:
        """Identical main-thread stacks together; the smallest groups (the odd ones out)
        first, then by their first process."""
        by_key: dict[tuple[Any, ...], list[ProcessStacks]] = {}
        for proc in self.answered():
            by_key.setdefault(proc.key(), []).append(proc)
        groups = [StackGroup(procs) for procs in by_key.values()]
        order = {p.process: i for i, p in enumerate(self.processes)}
        return sorted(groups, key=lambda g: (len(g.processes), order[g.processes[0].process]))

    def odd_ones_out(self) -> list[str]:
        """The processes standing somewhere else than the largest group, when there is one."""
        groups = self.groups()
        if len(groups) < 2 or len(groups[-1].processes) == len(groups[-2].processes):
            return []
        return [name for g in groups[:-1] for name in g.names]

    def headline(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.taken))
        groups = self.groups()
        kinds = f"{len(groups)} different stack{'s' if len(groups) != 1 else ''}"
        return f"stacks of {len(self.processes)} processes at {when} ({self.reason}): {kinds}"

    def text(self, frames: int = 8) -> str:
        """The grouped view: a headline per group, then its innermost ``frames`` frames,
        the other threads of the program in one line each, and who did not answer."""
        lines = [self.headline()]
        for group in self.groups():
            lines.append(f"  {group.headline()}")
            stack = group.stack
            shown = stack.frames[-frames:] if stack else []
            if stack and len(stack.frames) > len(shown):
                lines.append(f"      ... {len(stack.frames) - len(shown)} outer frames")
            for f in shown:
                code = f": {f.code}" if f.code else ""
                lines.append(f"      {f.where()} in {f.function}{code}")
            first = group.processes[0]
            for thread in first.threads:
                if not thread.main and not thread.ours:
                    lines.append(f"      thread {thread.name}: {thread.summary()}")
            for proc in group.processes:
                lines.extend(_native_lines(proc))
        for proc in self.processes:
            if proc.error:
                lines.append(f"  {proc.label}: {proc.error}")
                lines.extend(_native_lines(proc))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "reason": self.reason,
            "taken": self.taken,
            "processes": [p.to_dict() for p in self.processes],
        }

    def model(self) -> dict[str, Any]:
        """The report with its groups and text, as the REST API and the widget serve it."""
        return {
            **self.to_dict(),
            "groups": [g.to_dict() for g in self.groups()],
            "odd_ones_out": self.odd_ones_out(),
            "text": self.text(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StacksReport:
        return cls(
            str(data["job"]),
            str(data["reason"]),
            float(data["taken"]),
            [ProcessStacks.from_dict(p) for p in data.get("processes", [])],
        )
