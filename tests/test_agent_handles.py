"""The remote launchers' process handles (no cluster: a stand-in srun that ends as a
cancelled step does): what a process that ended without an exit code leaves in its log."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from jupyter_distrain.launchers.agent.client import EXIT_LOST
from jupyter_distrain.launchers.slurm.step import SlurmProcess, Step

SLOW_SLURM = 1.0  # seconds Slurm takes to say what became of the job (squeue, loaded)


def _slow_explain() -> str:
    time.sleep(SLOW_SLURM)
    return "Slurm job 38 is CANCELLED"


def test_a_lost_tasks_log_says_so_before_any_thread_learns_its_exit(tmp_path: Path):
    """The waiter and the loop's poll both ask a lost task for its code; the job's
    failure reads the log's tail as soon as either answers. Failed before the note was
    written under a lock: the second asker got 255 while the first still asked Slurm,
    and the job's error tail lacked the note (CI, a scancel under load)."""
    srun = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]  # ends with its stdin
    step = Step(srun, 1, dict(os.environ), explain=_slow_explain)
    log = tmp_path / "worker-0.log"
    step.attach_log(0, log)
    process = SlurmProcess(step, 0, "node1", {"argv": ["true"]})
    assert step.close_input(10)  # srun ends: its task's reports end with no exit code
    waiter = threading.Thread(target=process.wait)
    waiter.start()
    while not process.agent.ended():
        time.sleep(0.01)
    time.sleep(SLOW_SLURM / 4)  # the waiter is asking Slurm by now
    assert process.poll() == EXIT_LOST
    assert "lost task 0 on node1: Slurm job 38 is CANCELLED" in log.read_text()
    waiter.join(10)
    step.kill()
