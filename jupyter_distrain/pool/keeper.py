"""The pool keeper: ``python -m jupyter_distrain.pool.keeper DIR KIND``, one per pool.

Started detached by the notebook when a job of its kind is submitted, it owns the
pool's idle processes (its children) and serves one Unix socket in the pool's
private directory:

- ``claim`` (from a job's supervisor, with its network namespace): hand a ready idle
  process over to the job, answer its pid; the connection stays open and gets the
  process's exit code when it ends (the keeper is its parent). A supervisor that
  goes away first takes its process with it (killed, with what it started).
- ``running`` (from a supervisor, before its first claim): a job runs while this
  connection is open; a zygote started meanwhile imports lowered (``priority``).
- ``want`` (from a supervisor whose job ended): keep this many idle processes,
  imported with this environment; refilled at once, in the background.
- ``drain``: end every idle process now, and the keeper once no job holds one.

Where what imports beside a job can be lowered and put back (``priority.can_lower``),
each claim also keeps the pool one run ahead: as many processes as the claiming run
has asked for are forked for the next run at once, rather than when it ends.

Bounded: at most ``JUPYTER_DISTRAIN_POOL_SIZE`` idle processes (4), with their zygote
at most ``JUPYTER_DISTRAIN_POOL_MEMORY`` GiB (a quarter of the RAM; see ``stock``),
none started while less than 2 GiB is free; unused for ``JUPYTER_DISTRAIN_POOL_IDLE``
seconds (600), the pool empties and the keeper exits. ``state.json`` in the pool
directory says what it holds.

Here is the loop and the socket; ``stock`` holds the idle processes, ``claims`` the
claim queue and the claimed processes, ``orphans`` what those leave behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..contract.private import write_atomic
from ..processes import become_subreaper, reap_zombies, start_time
from . import priority, wire
from .claims import Claims
from .kinds import PREIMPORTS, pool_name, pool_prefix
from .settings import Settings
from .stock import Stock, close_fds

log = logging.getLogger("jupyter_distrain.pool")

TICK_SECONDS = 5.0  # the loop wakes on requests and on SIGCHLD; this is for expiry only
# A run claims its processes one after another, each once the last was handed over: the
# refill (a fork of the zygote, its memory measured) waits until no claim came for this
# long, rather than delay the run's next claim by ~30 ms each
CLAIMS_QUIET_SECONDS = 0.1


class Keeper:
    """The event loop of one pool: a selector over the listening socket, the clients
    and the idle processes' channels, plus a tick that reaps, expires and refills."""

    def __init__(self, directory: Path, kind: str, settings: Settings):
        self.dir, self.kind, self.settings = directory, kind, settings
        self.selector = selectors.DefaultSelector()
        self.stock = Stock(directory, kind, settings, self.selector, self._on_ready)
        self.claims = Claims(self.stock, self.selector, ahead=priority.can_lower())
        self.running: set[socket.socket] = set()  # supervisors of running jobs
        self.last_used = time.monotonic()
        self.last_claim = float("-inf")
        self._saved = ""
        path = wire.keeper_socket(directory)
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
        self._me = {"pid": os.getpid(), "create_time": start_time(os.getpid())}

    def run(self) -> None:
        """Serve until the pool is empty, no job holds one of its processes, and it has
        been unused for the idle limit."""
        log.info("keeper of %s pool %s, pid %d", self.kind, self.dir.name, os.getpid())
        while self.claims.claimed or self.stock.pids() or not self._unused():
            quiet_in = self._claims_quiet_in()
            for key, _ in self.selector.select(quiet_in if quiet_in > 0 else TICK_SECONDS):
                self._step(key.data, key.fileobj)
            self._reap()
            self._prioritize()
            self.claims.serve()
            if self._unused():
                self.stock.drain(f"unused for {self.settings.idle_seconds:g} s")
            if self._claims_quiet_in() <= 0:
                self._step(self._refill)
            self._step(self._save)  # cheap: the listing shows each claim at once
        log.info("keeper exits: the pool is empty and unused")

    def _claims_quiet_in(self) -> float:
        """Seconds until the claims have been quiet for ``CLAIMS_QUIET_SECONDS`` (<= 0:
        they have, and the pool may refill)."""
        return self.last_claim + CLAIMS_QUIET_SECONDS - time.monotonic()

    def _step(self, action: Callable[..., None], *args: Any) -> None:
        """One step of the loop; an ``OSError`` (a full disk writing the state, EAGAIN
        from fork, EMFILE in accept) is logged and the loop goes on: the jobs holding
        pooled processes need the keeper for their exit codes."""
        try:
            action(*args)
        except OSError as exc:
            log.warning("%s failed: %s", getattr(action, "__name__", "a step"), exc)

    def close(self) -> None:
        """End the idle processes and remove the socket and the state."""
        self.stock.drain("the keeper ends")  # claimed processes are their jobs' now
        self.listener.close()
        with contextlib.suppress(OSError):
            wire.keeper_socket(self.dir).unlink(missing_ok=True)
            (self.dir / "state.json").unlink(missing_ok=True)

    def _woken(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)

    def _unused(self) -> bool:
        if self.stock.off:
            return True
        return time.monotonic() - self.last_used > self.settings.idle_seconds

    def _refill(self) -> None:
        """Refill, unless this package or the kind's libraries changed since the keeper
        started (its pool's name no longer matches what the kind runs): then the pool is
        stale, and ends."""
        if self.stock.target > len(self.stock.idle) and self._stale():
            self.stock.turn_off("the installed code changed (a new pool takes its place)")
            return
        self.stock.refill()

    def _stale(self) -> bool:
        name = self.dir.name
        return name.startswith(pool_prefix(self.kind)) and name != pool_name(self.kind)

    def _prioritize(self) -> None:
        """Refill at idle priority while a job runs; at normal priority once none does."""
        busy = bool(self.running or self.claims.claimed)
        if self.stock.background and not busy:
            self.stock.foreground()
        self.stock.background = busy and self.claims.ahead

    def _on_ready(self) -> None:
        self.claims.serve()

    def _pool_pids(self) -> set[int]:
        return {*self.stock.pids(), *self.claims.claimed}

    def _reap(self) -> None:
        self.stock.reap()
        self.claims.reap(self._pool_pids())
        reap_zombies(keep=self._pool_pids())  # what claimed processes left behind

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
                self.last_used = self.last_claim = time.monotonic()
                self.claims.claim(client, body, fds)  # the descriptors are the claim's now
                return
            close_fds(fds)
            if body is None:
                self.running.discard(client)
                self.claims.client_gone(client)
            elif body.get("op") == "running":  # no answer: the connection is the message
                self.last_used = time.monotonic()
                self.running.add(client)
                self._prioritize()
            elif body.get("op") == "want":
                self.last_used = time.monotonic()
                self.stock.want(body)
                wire.send(client, {"ok": True})
            elif body.get("op") == "drain":  # the pool ends (once no job holds a process)
                self.stock.drain("asked to")
                self.last_used = float("-inf")
                wire.send(client, {"ok": True})
            else:
                wire.send(client, {"error": f"unknown request {body.get('op')!r}"})
        except OSError as exc:
            log.warning("client request failed: %s", exc)

    def state(self) -> dict[str, Any]:
        """What ``state.json`` says: the keeper, its settings and its processes."""
        return {
            **self._me,
            "kind": self.kind,
            "python": sys.executable,
            "imports": PREIMPORTS[self.kind],
            "target": self.stock.target,
            "size": self.settings.size,
            "idle_seconds": self.settings.idle_seconds,
            "error": self.stock.error or self.stock.off,
            "idle": self.stock.rows(),
            "zygote": self.stock.zygote_row(),
            "claimed": self.claims.rows(),
        }

    def _save(self) -> None:
        text = json.dumps(self.state(), indent=1)
        if text != self._saved:
            write_atomic(self.dir / "state.json", text)
            self._saved = text


def main(argv: list[str]) -> int:
    """``DIR KIND``: keep the pool in ``DIR`` unless another keeper has it."""
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
