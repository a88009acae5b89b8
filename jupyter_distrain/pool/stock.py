"""A pool's idle processes: a zygote imports with the environment the last job wanted,
then forks idle processes up to the wanted count and the memory bound (the zygote at
its size, each forked process at what it holds alone), each announcing when it is
ready; ended when the pool is drained or the environment changes. A pool found unable
to serve jobs at all is turned off: it says why in its directory's ``off`` file, and
no keeper runs it again."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ..processes import die_with_parent, end_child, private_bytes, signal_pid, tree_rss
from . import priority, wire
from .kinds import import_differences, without_per_job
from .settings import Settings

log = logging.getLogger("jupyter_distrain.pool")

MIN_FREE_BYTES = 2 * 2**30
FORK_SECONDS = 5.0  # the zygote answers a fork request within this
ZYGOTE_BYTES = 512 * 2**20  # what a zygote still importing counts, before one was ready
FORK_BYTES = 64 * 2**20  # what a forked process counts, before one was measured
OFF_FILE = "off"  # in the pool directory: why the pool is off


@dataclasses.dataclass
class Pooled:
    """One process of the pool: idle (``channel`` open) or claimed by a job (``client``)."""

    popen: subprocess.Popen[bytes] | Forked
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


class Forked:
    """A process the zygote forked: the keeper's child (the keeper is a subreaper and
    the process's first parent exited at once), with the calls of ``Popen`` the pool
    makes, on its pid."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours (cannot be: its pid is kept from reaping)
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return code

    def terminate(self) -> None:
        signal_pid(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        signal_pid(self.pid, signal.SIGKILL)


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
        self.zygote: Pooled | None = None  # imported with ``env``; forks the idle ones
        self.target = 0
        self.env: dict[str, str] | None = None  # what idle processes import with
        self.error = ""  # a process failed to start: no refill until the next want
        self.off = ""  # why this pool can never serve a job ("" while it can)
        self.zygote_bytes = ZYGOTE_BYTES  # the size of the last zygote that got ready
        self.fork_bytes = FORK_BYTES  # what the last forked process held alone
        self.background = False  # start processes at idle priority (a job is running)
        self.ahead_of = ""  # the run whose claims start processes now (for the next)

    def want(self, body: dict[str, Any]) -> None:
        """Keep ``count`` idle processes imported with ``env`` (less what is set per job)."""
        env = body.get("env")
        count = body.get("count")
        if not isinstance(env, dict) or not isinstance(count, int):
            return
        if self.env is None or import_differences(self.env, env):  # of no use now
            self.drain("the environment changed")
            self.env = without_per_job(env)
        self.target = min(self.settings.size, max(0, count))
        self.error = ""
        self.ahead_of = ""

    def keep_at_least(self, env: dict[str, str], count: int, run: str) -> None:
        """Raise the target to ``count`` for ``env`` (a claim's: one run ahead of
        ``run``); a new environment replaces the pool's, as a ``want`` does."""
        if self.env is None or import_differences(self.env, env):
            self.want({"env": env, "count": count})
        elif not self.error:
            self.target = max(self.target, min(self.settings.size, count))
        self.ahead_of = run

    def foreground(self) -> None:
        """No job runs, or one waits: every idle process back to normal priority."""
        self.background = False
        for pooled in self._processes():
            self.restore(pooled)

    def restore(self, pooled: Pooled) -> None:
        """Put ``pooled`` back to normal priority, if it was started lowered."""
        if pooled.lowered:
            priority.restore(pooled.pid)
            pooled.lowered = False

    def refill(self) -> None:
        """Fork idle processes up to the target, as memory allows, once the zygote has
        imported (it is started first)."""
        if self.env is None or self.error or self.off:
            return
        if self.zygote is None:
            if len(self.idle) < self.target and self._room():
                self.zygote = self._start()
            return
        while self.zygote.ready and len(self.idle) < self.target and self._room():
            if not self._fork(self.zygote):
                return

    def _room(self) -> bool:
        """Whether memory allows one more process: the zygote at its size (while it
        imports, at the size the last one had), and each idle process at what it holds
        alone (what it wrote since the fork: it shares the rest with the zygote)."""
        if psutil.virtual_memory().available < MIN_FREE_BYTES:
            return False
        zygote = self.zygote
        if zygote is None:
            return self.zygote_bytes <= self.settings.memory_bytes
        held = tree_rss(zygote.pid) if zygote.ready else self.zygote_bytes
        held += sum(
            private_bytes(p.pid) if p.ready else self.fork_bytes for p in self.idle.values()
        )
        return held + self.fork_bytes <= self.settings.memory_bytes

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

    def _start(self) -> Pooled:
        """The zygote: a process that imports with ``env``, then forks idle ones."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lowered = self.background

        def preexec() -> None:
            die_with_parent()
            if lowered:
                priority.lower()

        with open(self.dir / "pool.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "jupyter_distrain.pool.idle", str(theirs.fileno())]
                + [self.kind, "--zygote"],
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
        self.selector.register(ours, selectors.EVENT_READ, self._message)
        log.info("started the zygote, pid %d%s", popen.pid, " at idle priority" * lowered)
        return Pooled(popen, ours, time.time(), lowered=lowered, ahead_of=self.ahead_of)

    def _fork(self, zygote: Pooled) -> bool:
        """One more idle process, forked by the zygote; False if it could not."""
        assert zygote.channel is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            wire.send(zygote.channel, {"fork": True, "keeper": os.getpid()}, [theirs.fileno()])
            zygote.channel.settimeout(FORK_SECONDS)
            answer, _ = wire.receive(zygote.channel)
        except (OSError, ValueError) as exc:
            answer = {"error": str(exc)}
        finally:
            theirs.close()
            zygote.channel.settimeout(None)
        if not answer or not isinstance(answer.get("pid"), int) or answer["pid"] <= 0:
            ours.close()
            log.warning("the zygote could not fork: %s", (answer or {}).get("error", "it ended"))
            return False
        pooled = Pooled(
            Forked(answer["pid"]), ours, time.time(), lowered=zygote.lowered, ahead_of=self.ahead_of
        )
        self.idle[pooled.pid] = pooled
        self.selector.register(ours, selectors.EVENT_READ, self._message)
        log.info("forked pooled pid %d", pooled.pid)
        return True

    def _message(self, channel: socket.socket) -> None:
        pooled = next(p for p in self._processes() if p.channel is channel)
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
            if pooled is self.zygote:
                self.zygote_bytes = tree_rss(pooled.pid) or self.zygote_bytes
            else:
                self.fork_bytes = private_bytes(pooled.pid) or self.fork_bytes
            self.on_ready()

    def _processes(self) -> list[Pooled]:
        """The idle processes and the zygote."""
        return [*self.idle.values(), *([self.zygote] if self.zygote else [])]

    def waited_for(self, run: str) -> list[Pooled]:
        """The processes a claim of ``run`` waits for (not those started for its next)."""
        return [p for p in self._processes() if p.ahead_of != run]

    def pids(self) -> set[int]:
        """The pids of the idle processes and of the zygote."""
        return {p.pid for p in self._processes()}

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
        """End every idle process and the zygote now; none is started until the next
        want."""
        if self.idle:
            log.info("ending %d idle processes: %s", len(self.idle), why)
        for pooled in self._processes():
            self._close_channel(pooled)
            end_child(pooled.popen, 2)
        self.idle.clear()
        self.zygote = None
        self.target = 0

    def reap(self) -> None:
        """Forget idle processes (and a zygote) that ended; one that ended before it was
        ready stops refills (see ``pool.log``)."""
        for pooled in self._processes():
            code = pooled.popen.poll()
            if code is None:
                continue
            if pooled is self.zygote:
                self.zygote = None
            else:
                del self.idle[pooled.pid]
            self._close_channel(pooled)
            if not pooled.ready:
                self.error = f"a pooled process failed to start (exit {code}): see pool.log"
                log.error("%s", self.error)

    def pending(self, run: str) -> int:
        """How many idle processes the zygote is yet to fork for a claim of ``run``:
        none while it imports for that run's next (it is for the run after)."""
        zygote = self.zygote
        if zygote is None or (zygote.ahead_of == run and not zygote.ready):
            return 0
        return max(0, self.target - len(self.idle))

    def rows(self) -> list[dict[str, Any]]:
        """The idle processes, as ``state.json`` lists them."""
        return [
            {"pid": p.pid, "ready": p.ready, "since": p.since, "lowered": p.lowered}
            for p in self.idle.values()
        ]

    def zygote_row(self) -> dict[str, Any] | None:
        """The zygote, as ``state.json`` shows it."""
        z = self.zygote
        return None if z is None else {"pid": z.pid, "ready": z.ready, "lowered": z.lowered}
