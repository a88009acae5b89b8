"""Claims from jobs' supervisors: refused when the pool cannot serve them, queued for
the next ready process (one still importing is worth waiting for), handed over with the
job's network namespace; the claimed process's exit code goes back on the claim's
connection, and a supervisor that goes away first takes its process with it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import selectors
import socket
import sys
import time
from typing import Any

from ..contract.process import Env
from ..processes import kill_left_behind, kill_pid_tree, start_time
from . import wire
from .kinds import ENV_DIFFERS, import_differences
from .stock import Pooled, Stock, close_fds

log = logging.getLogger("jupyter_distrain.pool")

CLAIM_SECONDS = 5.0  # a ready pooled process answers a claim within this
WAIT_SECONDS = 8.0  # a claim waits this long for a process still importing


@dataclasses.dataclass
class Waiting:
    """A claim waiting for a pooled process to finish importing."""

    client: socket.socket
    body: dict[str, Any]
    fds: list[int]
    since: float


def _run_of(body: dict[str, Any]) -> str:
    """The run (one generation of a job) a claim is for."""
    return str(body.get("run") or body.get("job", ""))


class Claims:
    """The claim queue and the claimed processes of one pool, taken from ``stock``."""

    def __init__(self, stock: Stock, selector: selectors.BaseSelector, ahead: bool):
        self.stock = stock
        self.selector = selector
        self.waiting: list[Waiting] = []  # claims for processes still importing
        self.claimed: dict[int, Pooled] = {}
        self.ahead = ahead  # refill at claim time, what imports lowered (see priority.py)
        self._run, self._count = "", 0  # the run that claimed last, and how many

    def _env_refusal(self, body: dict[str, Any]) -> str:
        """Why the pool's processes cannot serve this fit claim now ("" if they can)."""
        if self.stock.env is None:
            return "the pool is empty"
        differs = import_differences(self.stock.env, body["env"])
        if differs:
            return f"{ENV_DIFFERS} {', '.join(differs[:3])}" + " ..." * (len(differs) > 3)
        return ""

    def _unfit(self, body: dict[str, Any]) -> str:
        """Why no process of this pool could ever serve this claim ("" if one could)."""
        argv, env = body.get("argv"), body.get("env")
        if not isinstance(argv, list) or not argv or argv[0] != sys.executable:
            return "the job's interpreter is not the pool's"
        if not isinstance(env, dict) or not isinstance(body.get("log"), str):
            return "a malformed claim"
        if self.stock.off:
            return f"the pool is off: {self.stock.off}"
        return ""

    def claim(self, client: socket.socket, body: dict[str, Any], fds: list[int]) -> None:
        """Queue the claim for the next ready process. One still being made for an
        earlier run (a fork, or the zygote importing) is worth waiting for: a cold start
        would import beside it, on the same cores. One this claim's own run asked for is
        for the run after."""
        unfit = self._unfit(body)
        reason = unfit or self._env_refusal(body)
        if self._ahead(body) and not unfit:
            self._plan_ahead(body)
        if not reason and self._serviceable(body) <= len(self.waiting):
            reason = "no pooled process is left"
        if reason:
            close_fds(fds)
            self.refuse(client, reason)
            return
        self.waiting.append(Waiting(client, body, fds, time.monotonic()))
        self.serve()

    def _ahead(self, body: dict[str, Any]) -> bool:
        """Whether this claim keeps the pool one run ahead (the job may say not to)."""
        return self.ahead and body.get("ahead", True) is not False

    def _plan_ahead(self, body: dict[str, Any]) -> None:
        """Keep as many processes as this run has claimed so far, for the next run."""
        run = _run_of(body)
        if run != self._run:
            self._run, self._count = run, 0
        self._count += 1
        self.stock.keep_at_least(body["env"], self._count, run)

    def _serviceable(self, body: dict[str, Any]) -> int:
        """Idle processes a claim may have or wait for: not those its own run's claims
        started for the next run, while they import."""
        run = _run_of(body)
        idle = sum(p.ready or p.ahead_of != run for p in self.stock.idle.values())
        return idle + self.stock.pending(run)

    def refuse(self, client: socket.socket, reason: str) -> None:
        """Tell the supervisor to start cold, and hang up."""
        log.info("a claim starts cold: %s", reason)
        with contextlib.suppress(OSError):
            wire.send(client, {"empty": reason})
        self.selector.unregister(client)
        client.close()

    def serve(self) -> None:
        """Hand ready processes to waiting claims; refuse those that waited too long or
        that no process is left for."""
        now = time.monotonic()
        for claim in [c for c in self.waiting if now - c.since > WAIT_SECONDS]:
            self.waiting.remove(claim)
            close_fds(claim.fds)
            self.refuse(claim.client, "no pooled process became ready in time")
        while self.waiting:
            pooled = self.stock.ready_one()
            if pooled is None:
                claim = self.waiting[-1]
                if self._serviceable(claim.body) < len(self.waiting):  # one starting died
                    self.waiting.pop()
                    close_fds(claim.fds)
                    self.refuse(claim.client, "no pooled process is left")
                    continue
                for pooled in self.stock.waited_for(_run_of(claim.body)):
                    self.stock.restore(pooled)  # a job waits for them: not lowered now
                return
            claim = self.waiting.pop(0)
            try:
                self._hand_over(claim, pooled)
            finally:
                close_fds(claim.fds)

    def _hand_over(self, claim: Waiting, pooled: Pooled) -> None:
        self.stock.restore(pooled)  # it may have got ready at idle priority
        channel = self.stock.take(pooled)
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
            kill_pid_tree(pooled.pid)
            if (answer or {}).get("off"):  # as it would be at every claim: no more pool
                self.stock.turn_off(why)
            self.refuse(claim.client, f"the pooled process could not take the job: {why}")
            return
        if not self._ahead(claim.body):  # refilled when the job ends (want): not beside it
            self.stock.target = max(0, self.stock.target - 1)
        pooled.client, pooled.job = claim.client, str(claim.body.get("job", ""))
        pooled.since = time.time()
        create_time = start_time(pooled.pid)
        with contextlib.suppress(OSError):
            wire.send(claim.client, {"pid": pooled.pid, "create_time": create_time})
        log.info("pid %d taken by %s", pooled.pid, pooled.job)

    def client_gone(self, client: socket.socket) -> None:
        """A supervisor hung up: drop its waiting claims, kill the processes it holds."""
        self.selector.unregister(client)
        client.close()
        for claim in [c for c in self.waiting if c.client is client]:
            self.waiting.remove(claim)
            close_fds(claim.fds)
        for pooled in list(self.claimed.values()):
            if pooled.client is client:  # its supervisor went away: the process goes too
                log.warning("the supervisor of %s is gone: killing pid %d", pooled.job, pooled.pid)
                pooled.client = None
                kill_pid_tree(pooled.pid)

    def reap(self, pool_pids: set[int]) -> None:
        """Send each ended claimed process's exit code to its supervisor, and kill what
        it left behind."""
        for pooled in list(self.claimed.values()):
            code = pooled.popen.poll()
            if code is None:
                continue
            del self.claimed[pooled.pid]
            kill_left_behind(pooled.pid, Env.JOB_DIR, pooled.job, pool_pids)
            if pooled.client is not None:
                with contextlib.suppress(OSError):
                    wire.send(pooled.client, {"exit": code})

    def rows(self) -> list[dict[str, Any]]:
        """The claimed processes, as ``state.json`` lists them."""
        return [{"pid": p.pid, "job": p.job} for p in self.claimed.values()]
