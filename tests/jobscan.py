"""Finding every process of a job on this machine, whoever started it: the process scan
the fault tests end with. A process belongs to a job when its command line names the
job directory or its environment carries it (children inherit it, also after setsid)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from jupyter_distrain.contract.process import Env


def processes_of(job_path: Path) -> list[psutil.Process]:
    path = str(job_path)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if (
                any(path in part for part in proc.info["cmdline"] or [])
                or proc.environ().get(Env.JOB_DIR) == path
            ):
                found.append(proc)
    return found


def numbered_lines_intact(text: str, prefix: str) -> int:
    """How many ``prefix N`` lines the text has, asserting they run 0, 1, 2, ... with no
    gap: every line written before a fault is on disk. Returns the count."""
    numbers = [int(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)]
    assert numbers == list(range(len(numbers))), numbers[:20]
    return len(numbers)


def processes_naming(job_id: str) -> list[psutil.Process]:
    """Every live process whose command line or environment names the job, on any
    "host" of the multi-host tests (they share this machine's pid space). The
    environment is read raw: Ray's processes write their titles over it, and mpirun's
    ranks carry the job directory as a template."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            raw = Path(f"/proc/{proc.pid}/environ").read_bytes()
            if job_id.encode() in raw or any(job_id in part for part in proc.cmdline()):
                found.append(proc)
    return found


def left_after(find: Callable[[], list[psutil.Process]], seconds: float) -> list[psutil.Process]:
    """What ``find`` still finds after up to ``seconds`` (an empty list as soon as it
    finds nothing)."""
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left
