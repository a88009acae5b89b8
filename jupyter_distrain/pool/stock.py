"""A pool's idle processes: started with the environment the last job wanted, up to
the wanted count and the memory bound (those still importing counted at the size of
the last ready one), each announcing when its imports are done; ended when the pool is
drained or the environment changes. A pool found unable to serve jobs at all is turned
off: it says why in its directory's ``off`` file, and no keeper runs it again."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ..processes import die_with_parent, tree_rss
from . import priority, wire
from .kinds import import_env
from .settings import Settings

log = logging.getLogger("jupyter_distrain.pool")

MIN_FREE_BYTES = 2 * 2**30
PROCESS_BYTES = 512 * 2**20  # what a process still importing counts, before one is ready
OFF_FILE = "off"  # in the pool directory: why the pool is off


@dataclasses.dataclass
class Pooled:
    """One process of the pool: idle (``channel`` open) or claimed by a job (``client``)."""

    popen: subprocess.Popen[bytes]
    channel: socket.socket | None
    since: float
    ready: bool = False
    job: str = ""
    client: socket.socket | None = None
    lowered: bool = False  # importing at idle priority (beside a running job)
    ahead_of: str = ""  # the run whose claims started it, for the run after

    @property
    def pid(self) -> int:
        return self.popen.pid


def close_fds(fds: list[int]) -> None:
    """Close descriptors that came with a message, whatever state they are in."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Stock:
    """The idle processes of one pool (the keeper's children), their channels watched by
    the keeper's ``selector``; ``on_ready`` is called when one has finished importing."""

    def __init__(
        self,
        directory: Path,
        kind: str,
        settings: Settings,
        selector: selectors.BaseSelector,
        on_ready: Callable[[], None],
    ):
        self.dir, self.kind, self.settings = directory, kind, settings
        self.selector = selector
        self.on_ready = on_ready
        self.idle: dict[int, Pooled] = {}
        self.target = 0
        self.env: dict[str, str] | None = None  # what idle processes import with
        self.error = ""  # a process failed to start: no refill until the next want
        self.off = ""  # why this pool can never serve a job ("" while it can)
        self.process_bytes = PROCESS_BYTES  # the size of the last process that got ready
        self.background = False  # start processes at idle priority (a job is running)
        self.ahead_of = ""  # the run whose claims start processes now (for the next)

    def want(self, body: dict[str, Any]) -> None:
        """Keep ``count`` idle processes imported with ``env`` (but its ``per_job`` names)."""
        env = body.get("env")
        count = body.get("count")
        if not isinstance(env, dict) or not isinstance(count, int):
            return
        env = import_env(env, body.get("per_job") or [])
        if env != self.env:  # imported with another environment: of no use now
            self.drain("the environment changed")
            self.env = env
        self.target = min(self.settings.size, max(0, count))
        self.error = ""
        self.ahead_of = ""

    def keep_at_least(self, env: dict[str, str], per_job: list[str], count: int, run: str) -> None:
        """Raise the target to ``count`` for ``env`` (a claim's: one run ahead of
        ``run``); a new environment replaces the pool's, as a ``want`` does."""
        if import_env(env, per_job) != self.env:
            self.want({"env": env, "per_job": per_job, "count": count})
        elif not self.error:
            self.target = max(self.target, min(self.settings.size, count))
        self.ahead_of = run

    def foreground(self) -> None:
        """No job runs, or one waits: every idle process back to normal priority."""
        self.background = False
        for pooled in self.idle.values():
            self.restore(pooled)

    def restore(self, pooled: Pooled) -> None:
        """Put ``pooled`` back to normal priority, if it was started lowered."""
        if pooled.lowered:
            priority.restore(pooled.pid)
            pooled.lowered = False

    def refill(self) -> None:
        """Start idle processes up to the target, as memory allows."""
        if self.env is None or self.error or self.off:
            return
        while len(self.idle) < self.target and self._room():
            self._start()

    def _room(self) -> bool:
        """Whether memory allows one more idle process: the ready ones as they are, each
        one still importing (and the next) at the size of the last that got ready."""
        if psutil.virtual_memory().available < MIN_FREE_BYTES:
            return False
        ready = [tree_rss(p.pid) for p in self.idle.values() if p.ready]
        starting = len(self.idle) - len(ready)
        held = sum(ready) + starting * self.process_bytes
        return held + self.process_bytes <= self.settings.memory_bytes

    def turn_off(self, why: str) -> None:
        """This pool can never serve a job here: end its processes, say why once (in the
        log and the ``off`` file, which keeps later keepers from starting it again)."""
        if self.off:
            return
        self.off = why
        log.warning("the pool is off: %s", why)
        self.drain(why)
        with contextlib.suppress(OSError):
            (self.dir / OFF_FILE).write_text(why + "\n")

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lowered = self.background

        def preexec() -> None:
            die_with_parent()
            if lowered:
                priority.lower()

        with open(self.dir / "pool.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "jupyter_distrain.pool.idle", str(theirs.fileno())]
                + [self.kind],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.dir,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                preexec_fn=preexec,
            )
        theirs.close()
        pooled = Pooled(popen, ours, time.time(), lowered=lowered, ahead_of=self.ahead_of)
        self.idle[popen.pid] = pooled
        self.selector.register(ours, selectors.EVENT_READ, self._message)
        log.info("started pooled pid %d%s", popen.pid, " at idle priority" * lowered)

    def _message(self, channel: socket.socket) -> None:
        pooled = next(p for p in self.idle.values() if p.channel is channel)
        try:
            body, _ = wire.receive(channel)
        except (OSError, ValueError):
            body = None
        if body is None:  # it is ending; reap() collects it
            self._close_channel(pooled)
        elif body.get("off"):  # it cannot be made fit to serve any job
            self._close_channel(pooled)
            self.turn_off(str(body["off"]))
        elif body.get("ready"):
            pooled.ready, pooled.since = True, time.time()
            self.process_bytes = tree_rss(pooled.pid) or self.process_bytes
            self.on_ready()

    def _close_channel(self, pooled: Pooled) -> None:
        if pooled.channel is not None:
            self.selector.unregister(pooled.channel)
            pooled.channel.close()  # an idle process exits when its channel closes
            pooled.channel = None

    def ready_one(self) -> Pooled | None:
        """An idle process that has finished importing, if any."""
        return next((p for p in self.idle.values() if p.ready), None)

    def take(self, pooled: Pooled) -> socket.socket:
        """Take ``pooled`` out of the stock; its channel is the caller's now."""
        del self.idle[pooled.pid]
        channel = pooled.channel
        assert channel is not None
        self.selector.unregister(channel)
        pooled.channel = None
        return channel

    def drain(self, why: str) -> None:
        """End every idle process now; none is started until the next want."""
        if self.idle:
            log.info("ending %d idle processes: %s", len(self.idle), why)
        for pooled in list(self.idle.values()):
            self._close_channel(pooled)
            with contextlib.suppress(ProcessLookupError):
                pooled.popen.terminate()
            try:
                pooled.popen.wait(2)
            except subprocess.TimeoutExpired:
                pooled.popen.kill()
                pooled.popen.wait()
            del self.idle[pooled.pid]
        self.target = 0

    def reap(self) -> None:
        """Forget idle processes that ended; one that ended before it was ready stops
        refills (see ``pool.log``)."""
        for pooled in list(self.idle.values()):
            code = pooled.popen.poll()
            if code is None:
                continue
            del self.idle[pooled.pid]
            self._close_channel(pooled)
            if not pooled.ready:
                self.error = f"a pooled process failed to start (exit {code}): see pool.log"
                log.error("%s", self.error)

    def rows(self) -> list[dict[str, Any]]:
        """The idle processes, as ``state.json`` lists them."""
        return [
            {"pid": p.pid, "ready": p.ready, "since": p.since, "lowered": p.lowered}
            for p in self.idle.values()
        ]
