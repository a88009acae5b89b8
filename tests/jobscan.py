"""Finding every process of a job on this machine, whoever started it: the process scan
the fault tests end with. A process belongs to a job when its command line names the
job directory or its environment carries it (children inherit it, also after setsid)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from jupyter_distrain.contract import Env


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
