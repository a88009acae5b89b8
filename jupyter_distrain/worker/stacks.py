"""A worker's answer to a stacks request (``contract/stacks.py`` says how they are asked
for and kept).

:func:`install` registers :mod:`faulthandler` on ``STACKS_SIGNAL`` with a pipe as its
file and starts the thread that reads it. The dump is taken in the signal handler, so a
main thread blocked in a collective, a data loader or a lock is seen where it stands.
The pipe's write end does not block: were the reader unable to drain it (an interpreter
held by native code), a dump is cut short rather than the signalled thread frozen. The
reader thread blocks the signal for itself, so the handler never runs on the one thread
that empties the pipe.
"""

from __future__ import annotations

import faulthandler
import fcntl
import linecache
import os
import re
import select
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..contract.stacks import (
    MAX_CODE,
    MAX_FRAMES,
    OUR_THREADS,
    STACKS_SIGNAL,
    Frame,
    ProcessStacks,
    ThreadStack,
    short_path,
)

PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged pipe
ANSWER_BYTES = 60 * 1024  # what a control request's line holds, with room for the rest
QUIET_SECONDS = 0.1  # a dump is complete when nothing more came for this long

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_BOOTSTRAP = re.compile(r"^<frozen runpy>$|(^|/)runpy\.py$|(^|/)jupyter_distrain/worker/")
# the package's own files read "jupyter_distrain/...", wherever it is installed
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_kept: list[Any] = []


def parse_dump(text: str, own_roots: list[str]) -> list[ThreadStack]:
    """faulthandler's dump of every thread, as thread stacks (outermost frame first), with
    the threads' names and the source lines; files under ``own_roots`` are the program's."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    threads: list[ThreadStack] = []
    ident: int | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = int(head.group(2), 16)
            name = names.get(ident, f"thread {head.group(2)}")
            stack = ThreadStack(name, [], main=ident == main_ident, ours=name in OUR_THREADS)
            threads.append(stack)
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            path, number, function = frame.group(1), int(frame.group(2)), frame.group(3)
            root = next((r for r in own_roots if path.startswith(r.rstrip("/") + "/")), "")
            code = linecache.getline(path, number).strip()[:MAX_CODE]
            shown = short_path(path, root, _PACKAGE_PARENT)
            threads[-1].frames.insert(0, Frame(shown, number, function, code, own=bool(root)))
    for stack in threads:
        stack.frames = _without_bootstrap(stack.frames)[-MAX_FRAMES:]
    return threads


def _without_bootstrap(frames: list[Frame]) -> list[Frame]:
    """The frames from the program's own code in: the bootstrap's frames around it
    (``runpy``, ``jupyter_distrain/worker``) are the same in every process and say
    nothing (kept where nothing else is: a TensorFlow server's main thread)."""
    outer = 0
    while outer < len(frames) and _BOOTSTRAP.search(frames[outer].file):
        outer += 1
    return frames[outer:] if outer < len(frames) else frames


def _read_dump(fd: int) -> str:
    """One dump: what arrives until the pipe stays quiet (blocks until it starts)."""
    chunks = [os.read(fd, PIPE_BYTES)]
    while select.select([fd], [], [], QUIET_SECONDS)[0]:
        chunk = os.read(fd, PIPE_BYTES)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def install(
    me: str, name: str, own_roots: list[str], send: Callable[[dict[str, Any]], None]
) -> None:
    """Answer every ``STACKS_SIGNAL`` from now on with this process's stacks, given to
    ``send`` as a :class:`ProcessStacks` dict (process ``me``, named ``name``)."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # a lower system limit: the default 64 KiB holds most dumps
    os.set_blocking(write_fd, False)
    os.set_inheritable(read_fd, False)
    os.set_inheritable(write_fd, False)
    dump_file = os.fdopen(write_fd, "w")
    host = os.uname().nodename

    def answer() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {STACKS_SIGNAL})
        while True:
            text = _read_dump(read_fd)
            threads = parse_dump(text, own_roots)
            stacks = ProcessStacks(me, name, host, os.getpid(), threads)
            try:
                send(stacks.fitted(ANSWER_BYTES))
            except Exception as exc:  # the next request may get through
                print(
                    f"jupyter_distrain: could not send this process's stacks: {exc}",
                    file=sys.stderr,
                )

    # the signal may come at once: the reader is up before the handler is
    threading.Thread(target=answer, name="distrain-stacks", daemon=True).start()
    faulthandler.register(STACKS_SIGNAL, file=dump_file, all_threads=True, chain=False)
    _kept.append(dump_file)  # faulthandler keeps only its descriptor


def own_roots(job_dir: str, program: Path) -> list[str]:
    """The directories whose files are the program's own: the job's, the script's."""
    return sorted({job_dir, str(program.parent)})
