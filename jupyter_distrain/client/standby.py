"""The kernel's supervisor on standby (``supervisor/standby.py``): started as a job is
submitted, so the next job's supervisor is an already started Python with the supervisor
imported, not a new one (~0.09 s off a warm re-run's first step, measured). While the
job runs it imports lowered, on CPU time the job leaves (``pool/priority.py``), and is
put back to normal when it is handed a job or the job's follow ends; where a process
cannot be lowered and put back, it is started when a followed job ends instead.

It exists only with the warm pool on (``JUPYTER_DISTRAIN_POOL``, the same setting: both
trade an idle process for a faster start), is used once, is not used when this
package's source changed since it started, and ends when the kernel does (its stdin is
the kernel's end of a socket pair). Any failure of a hand-over falls back to the cold
start.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from ..contract.store import JobDir
from ..pool import priority, wire
from ..pool.kinds import enabled, source_fingerprint
from ..processes import inherited_environment, kill_group

log = logging.getLogger(__name__)

ANSWER_SECONDS = 5.0


@dataclass
class _Standby:
    proc: subprocess.Popen
    channel: socket.socket
    fingerprint: str
    launcher: str
    lowered: bool

    def restore(self) -> None:
        """Back to normal priority, if it was started lowered."""
        if self.lowered:
            priority.restore(self.proc.pid)
            self.lowered = False

    def discard(self) -> None:
        self.channel.close()  # an unused standby ends on its own when it sees this
        if self.proc.poll() is None:
            kill_group(self.proc.pid)


_standby: _Standby | None = None
_guard = threading.Lock()


def _take() -> _Standby | None:
    global _standby
    with _guard:
        standby, _standby = _standby, None
    return standby


def prepare(launcher: str = "local", lowered: bool = False) -> None:
    """Have a supervisor on standby for a job of ``launcher`` (the last one's), unless
    pools are off. ``lowered``: one started now imports beside a running job, on the CPU
    time it leaves, and is not started where it could not be put back to normal; without
    it, one that is ready is put back to normal."""
    global _standby
    if not enabled(os.environ):
        discard()
        return
    with _guard:
        if _standby is not None and _standby.proc.poll() is None:
            if _standby.launcher == launcher:
                if not lowered:
                    _standby.restore()
                return
            _standby.discard()
        if lowered and not priority.can_lower():
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_distrain.supervisor.standby", launcher],
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            log.warning("no supervisor on standby: %s", exc)
            return
        finally:
            theirs.close()
        if lowered:  # its own session by now: Popen returns once it has exec'd
            priority.lower(proc.pid)
        _standby = _Standby(proc, ours, source_fingerprint(), launcher, lowered)
    # reap it when it ends, used or not, so a long-lived kernel collects no zombies
    threading.Thread(target=proc.wait, daemon=True).start()


def discard() -> None:
    """End the supervisor on standby, if there is one."""
    standby = _take()
    if standby is not None:
        standby.discard()


def standby_pid() -> int | None:
    """The pid of the supervisor on standby, if one is ready."""
    standby = _standby
    return standby.proc.pid if standby is not None and standby.proc.poll() is None else None


def hand_over(job: JobDir, lock: int) -> bool:
    """Make the supervisor on standby ``job``'s supervisor, handing it ``lock``; False
    (and the standby ended) when there is none fit for it: the caller starts one cold."""
    standby = _take()
    if standby is None:
        return False
    if (
        not enabled(os.environ)
        or standby.proc.poll() is not None
        or standby.fingerprint != source_fingerprint()
    ):
        standby.discard()
        return False
    standby.restore()  # before it starts the job's processes, which inherit its priority
    answer: dict | None = None
    try:
        standby.channel.settimeout(ANSWER_SECONDS)
        env = inherited_environment()  # as the cold start's child would have it
        body = {"job": str(job.path), "env": env, "cwd": os.getcwd()}
        wire.send(standby.channel, body, [lock])
        answer, _ = wire.receive(standby.channel)
    except (OSError, ValueError) as exc:
        log.warning("the supervisor on standby did not take job %s: %s", job.id, exc)
    if answer is not None and answer.get("ok") == standby.proc.pid:
        standby.channel.close()
        return True
    if answer is not None:
        log.warning("the supervisor on standby did not take job %s: %s", job.id, answer)
    standby.discard()
    return False
