"""The pool keeper: ``python -m jupyter_distrain.pool.keeper DIR KIND``, one per pool.

Started detached by the notebook when a job of its kind is submitted, it owns the
pool's idle processes (its children) and serves one Unix socket in the pool's
private directory:

- ``claim`` (from a job's supervisor, with its network namespace): hand a ready idle
  process over to the job, answer its pid; the connection stays open and gets the
  process's exit code when it ends (the keeper is its parent). A supervisor that
  goes away first takes its process with it (killed, with what it started).
- ``want`` (from a supervisor whose job ended): keep this many idle processes,
  imported with this environment; refilled at once, in the background.
- ``drain``: end every idle process now, and the keeper once no job holds one.

Bounded: at most ``JUPYTER_DISTRAIN_POOL_SIZE`` idle processes (4), together at most
``JUPYTER_DISTRAIN_POOL_MEMORY`` GiB (a quarter of the RAM), none started while less
than 2 GiB is free; unused for ``JUPYTER_DISTRAIN_POOL_IDLE`` seconds (600), the pool
empties and the keeper exits. ``state.json`` in the pool directory says what it holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ..contract.process import Env
from ..contract.store import write_atomic
from ..processes import become_subreaper, die_with_parent, reap_zombies, signal_tree, tree_rss
from . import wire
from .kinds import PREIMPORTS, import_env

log = logging.getLogger("jupyter_distrain.pool")

DEFAULT_SIZE = 4
DEFAULT_IDLE_SECONDS = 600.0
MIN_FREE_BYTES = 2 * 2**30
CLAIM_SECONDS = 5.0  # a ready pooled process answers a claim within this
WAIT_SECONDS = 8.0  # a claim waits this long for a process still importing
TICK_SECONDS = 5.0  # the loop wakes on requests and on SIGCHLD; this is for expiry only


@dataclasses.dataclass
class Settings:
    size: int = DEFAULT_SIZE
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    memory_bytes: int = 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> Settings:
        total = psutil.virtual_memory().total
        try:
            size = int(environ.get(Env.POOL_SIZE, DEFAULT_SIZE))
            idle = float(environ.get(Env.POOL_IDLE, DEFAULT_IDLE_SECONDS))
            memory = float(environ.get(Env.POOL_MEMORY, total / 4 / 2**30))
        except ValueError as exc:
            log.warning("bad pool setting (%s): using the defaults", exc)
            return cls(memory_bytes=total // 4)
        return cls(max(0, size), max(1.0, idle), int(memory * 2**30))


@dataclasses.dataclass
class Pooled:
    """One process of the pool: idle (``channel`` open) or claimed by a job (``client``)."""

    popen: subprocess.Popen[bytes]
    channel: socket.socket | None
    since: float
    ready: bool = False
    job: str = ""
    client: socket.socket | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclasses.dataclass
class Waiting:
    """A claim waiting for a pooled process to finish importing."""

    client: socket.socket
    body: dict[str, Any]
    fds: list[int]
    since: float


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Keeper:
    """The event loop of one pool: a selector over the listening socket, the clients
    and the idle processes' channels, plus a tick that reaps, expires and refills."""

    def __init__(self, directory: Path, kind: str, settings: Settings):
        self.dir, self.kind, self.settings = directory, kind, settings
        self.idle: dict[int, Pooled] = {}
        self.claimed: dict[int, Pooled] = {}
        self.target = 0
        self.env: dict[str, str] | None = None  # what idle processes import with
        self.waiting: list[Waiting] = []  # claims for processes still importing
        self.last_used = time.monotonic()
        self.error = ""
        self._saved = ""
        self.selector = selectors.DefaultSelector()
        path = directory / "keeper.sock"
        path.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(16)
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        # a child's exit wakes the loop at once (its job's supervisor waits for the code),
        # and an idle keeper costs nothing beside training jobs
        self._wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(wakeup_write, False)
        os.set_blocking(self._wakeup_read, False)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self._wakeup_read, selectors.EVENT_READ, self._woken)
        me = psutil.Process()
        self._me = {"pid": me.pid, "create_time": me.create_time()}

    # --- the loop --------------------------------------------------------
    def run(self) -> None:
        log.info("keeper of %s pool %s, pid %d", self.kind, self.dir.name, os.getpid())
        while self.claimed or self.idle or not self._unused():
            for key, _ in self.selector.select(TICK_SECONDS):
                key.data(key.fileobj)
            self._reap()
            self._serve_waiting()
            if self._unused():
                self._drain(f"unused for {self.settings.idle_seconds:g} s")
            self._refill()
            self._save()
        log.info("keeper exits: the pool is empty and unused")

    def close(self) -> None:
        self._drain("the keeper ends")  # claimed processes are their jobs' now: left running
        self.listener.close()
        (self.dir / "keeper.sock").unlink(missing_ok=True)
        (self.dir / "state.json").unlink(missing_ok=True)

    def _woken(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)

    def _unused(self) -> bool:
        return time.monotonic() - self.last_used > self.settings.idle_seconds

    # --- requests --------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        client, _ = listener.accept()
        if not wire.peer_is_us(client):
            client.close()
            return
        self.selector.register(client, selectors.EVENT_READ, self._request)

    def _request(self, client: socket.socket) -> None:
        try:
            body, fds = wire.receive(client)
        except (OSError, ValueError):
            body, fds = None, []
        try:
            if body is not None and body.get("op") == "claim":
                self._claim(client, body, fds)  # the descriptors are the claim's now
                return
            _close(fds)
            if body is None:
                self._client_gone(client)
            elif body.get("op") == "want":
                self._want(body)
                wire.send(client, {"ok": True})
            elif body.get("op") == "drain":  # the pool ends (once no job holds a process)
                self._drain("asked to")
                self.last_used = float("-inf")
                wire.send(client, {"ok": True})
            else:
                wire.send(client, {"error": f"unknown request {body.get('op')!r}"})
        except OSError as exc:
            log.warning("client request failed: %s", exc)

    def _client_gone(self, client: socket.socket) -> None:
        self.selector.unregister(client)
        client.close()
        for claim in [c for c in self.waiting if c.client is client]:
            self.waiting.remove(claim)
            _close(claim.fds)
        for pooled in list(self.claimed.values()):
            if pooled.client is client:  # its supervisor went away: the process goes too
                log.warning("the supervisor of %s is gone: killing pid %d", pooled.job, pooled.pid)
                pooled.client = None
                signal_tree(psutil.Process(pooled.pid), signal.SIGKILL)

    def _refusal(self, body: dict[str, Any]) -> str:
        argv, env = body.get("argv"), body.get("env")
        if not isinstance(argv, list) or not argv or argv[0] != sys.executable:
            return "the job's interpreter is not the pool's"
        if not isinstance(env, dict) or not isinstance(body.get("log"), str):
            return "a malformed claim"
        if self.env is None:
            return "the pool is empty"
        per_job = set(body.get("per_job") or [])
        ours = {k: v for k, v in self.env.items() if k not in per_job}
        differs = sorted(set(import_env(env, per_job).items()) ^ set(ours.items()))
        if differs:
            return f"the environment differs from the pool's ({differs[0][0]})"
        return ""

    def _claim(self, client: socket.socket, body: dict[str, Any], fds: list[int]) -> None:
        """Queue the claim for the next ready process; a process still importing is
        worth waiting for (a cold start would import beside it, on the same cores)."""
        self.last_used = time.monotonic()
        reason = self._refusal(body)
        if not reason and len(self.idle) <= len(self.waiting):
            reason = "no pooled process is left"
        if reason:
            _close(fds)
            self._refuse(client, reason)
            return
        self.waiting.append(Waiting(client, body, fds, time.monotonic()))
        self._serve_waiting()

    def _refuse(self, client: socket.socket, reason: str) -> None:
        with contextlib.suppress(OSError):
            wire.send(client, {"empty": reason})
        self.selector.unregister(client)
        client.close()

    def _serve_waiting(self) -> None:
        now = time.monotonic()
        for claim in [c for c in self.waiting if now - c.since > WAIT_SECONDS]:
            self.waiting.remove(claim)
            _close(claim.fds)
            self._refuse(claim.client, "no pooled process became ready in time")
        while self.waiting:
            pooled = next((p for p in self.idle.values() if p.ready), None)
            if pooled is None:
                if len(self.idle) < len(self.waiting):  # one that was starting died
                    claim = self.waiting.pop()
                    _close(claim.fds)
                    self._refuse(claim.client, "no pooled process is left")
                    continue
                return
            claim = self.waiting.pop(0)
            try:
                self._hand_over(claim, pooled)
            finally:
                _close(claim.fds)

    def _hand_over(self, claim: Waiting, pooled: Pooled) -> None:
        del self.idle[pooled.pid]
        channel = pooled.channel
        assert channel is not None
        self.selector.unregister(channel)
        pooled.channel = None
        try:
            wire.send(channel, claim.body, claim.fds)
            channel.settimeout(CLAIM_SECONDS)
            answer, _ = wire.receive(channel)
        except (OSError, ValueError) as exc:
            answer = {"error": str(exc)}
        finally:
            channel.close()
        self.claimed[pooled.pid] = pooled  # reaped like any other, whatever happens next
        if not answer or not answer.get("ok"):
            why = (answer or {}).get("error") or "it ended"
            log.warning("pooled pid %d could not take the job: %s", pooled.pid, why)
            signal_tree(psutil.Process(pooled.pid), signal.SIGKILL)
            self._refuse(claim.client, f"the pooled process could not take the job: {why}")
            return
        # refilled when the job ends (want), not now: importing beside a training job
        # would slow it down
        self.target = max(0, self.target - 1)
        pooled.client, pooled.job = claim.client, str(claim.body.get("job", ""))
        pooled.since = time.time()
        create_time = psutil.Process(pooled.pid).create_time()
        with contextlib.suppress(OSError):
            wire.send(claim.client, {"pid": pooled.pid, "create_time": create_time})
        log.info("pid %d taken by %s", pooled.pid, pooled.job)

    def _want(self, body: dict[str, Any]) -> None:
        self.last_used = time.monotonic()
        env = body.get("env")
        count = body.get("count")
        if not isinstance(env, dict) or not isinstance(count, int):
            return
        env = import_env(env, body.get("per_job") or [])
        if env != self.env:  # imported with another environment: of no use now
            self._drain("the environment changed")
            self.env = env
        self.target = min(self.settings.size, max(0, count))
        self.error = ""

    # --- the pool --------------------------------------------------------
    def _refill(self) -> None:
        if self.env is None or self.error:
            return
        while len(self.idle) < self.target and self._room():
            self._start()

    def _room(self) -> bool:
        """Whether memory allows one more idle process."""
        if psutil.virtual_memory().available < MIN_FREE_BYTES:
            return False
        held = [tree_rss(p.pid) for p in self.idle.values() if p.ready]
        each = max(held) if held else 0
        return sum(held) + each <= self.settings.memory_bytes

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
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
                preexec_fn=die_with_parent,
            )
        theirs.close()
        pooled = Pooled(popen, ours, time.time())
        self.idle[popen.pid] = pooled
        self.selector.register(ours, selectors.EVENT_READ, self._idle_message)
        log.info("started pooled pid %d", popen.pid)

    def _idle_message(self, channel: socket.socket) -> None:
        pooled = next(p for p in self.idle.values() if p.channel is channel)
        try:
            body, _ = wire.receive(channel)
        except (OSError, ValueError):
            body = None
        if body is None:  # it is ending; _reap collects it
            self.selector.unregister(channel)
            channel.close()
            pooled.channel = None
        elif body.get("ready"):
            pooled.ready, pooled.since = True, time.time()
            self._serve_waiting()

    def _drain(self, why: str) -> None:
        if self.idle:
            log.info("ending %d idle processes: %s", len(self.idle), why)
        for pooled in list(self.idle.values()):
            self._let_go(pooled)
        self.target = 0

    def _let_go(self, pooled: Pooled) -> None:
        if pooled.channel is not None:
            self.selector.unregister(pooled.channel)
            pooled.channel.close()  # an idle process exits when its channel closes
            pooled.channel = None
        with contextlib.suppress(ProcessLookupError):
            pooled.popen.terminate()
        try:
            pooled.popen.wait(2)
        except subprocess.TimeoutExpired:
            pooled.popen.kill()
            pooled.popen.wait()
        self.idle.pop(pooled.pid, None)
        self.claimed.pop(pooled.pid, None)

    def _reap(self) -> None:
        for pooled in list(self.idle.values()):
            code = pooled.popen.poll()
            if code is None:
                continue
            del self.idle[pooled.pid]
            if pooled.channel is not None:
                self.selector.unregister(pooled.channel)
                pooled.channel.close()
            if not pooled.ready:
                self.error = f"a pooled process failed to start (exit {code}): see pool.log"
                log.error("%s", self.error)
        for pooled in list(self.claimed.values()):
            code = pooled.popen.poll()
            if code is None:
                continue
            del self.claimed[pooled.pid]
            self._kill_orphans(pooled)
            if pooled.client is not None:
                with contextlib.suppress(OSError):
                    wire.send(pooled.client, {"exit": code})
        self._reap_orphans()

    def _kill_orphans(self, ended: Pooled) -> None:
        """What a job's process started and left behind became ours (we are a subreaper):
        kill what belongs to its job (its session, or its job directory in the env)."""
        for child in self._orphans():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(child.pid) == ended.pid or (
                    ended.job and child.environ().get(Env.JOB_DIR) == ended.job
                ):
                    signal_tree(child, signal.SIGKILL)

    def _reap_orphans(self) -> None:
        reap_zombies(keep=self._pool_pids())

    def _pool_pids(self) -> set[int]:
        return {p.pid for p in [*self.idle.values(), *self.claimed.values()]}

    def _orphans(self) -> list[psutil.Process]:
        """Our children that are not pool processes: what a job's process left to us."""
        known = self._pool_pids()
        return [child for child in psutil.Process().children() if child.pid not in known]

    def state(self) -> dict[str, Any]:
        """What ``state.json`` says: the keeper, its settings and its processes."""
        return {
            **self._me,
            "kind": self.kind,
            "python": sys.executable,
            "imports": PREIMPORTS[self.kind],
            "target": self.target,
            "size": self.settings.size,
            "idle_seconds": self.settings.idle_seconds,
            "error": self.error,
            "idle": [
                {"pid": p.pid, "ready": p.ready, "since": p.since} for p in self.idle.values()
            ],
            "claimed": [{"pid": p.pid, "job": p.job} for p in self.claimed.values()],
        }

    def _save(self) -> None:
        text = json.dumps(self.state(), indent=1)
        if text != self._saved:
            write_atomic(self.dir / "state.json", text)
            self._saved = text


def main(argv: list[str]) -> int:
    directory, kind = Path(argv[0]), argv[1]
    lock = os.open(directory / "keeper.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another keeper has this pool
    logging.basicConfig(
        filename=directory / "keeper.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    become_subreaper()
    keeper = Keeper(directory, kind, Settings.from_env(os.environ))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        keeper.run()
    finally:
        keeper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
