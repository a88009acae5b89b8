"""A job's sessions on a host spread over as many ssh connections as they need.

sshd takes at most ``MaxSessions`` sessions on one connection (10 by default), and the
launcher runs one session per process (and a guard per host for mpirun's ranks), all
through the host's master connection: an eleventh process on a host was refused
("Session open refused by peer"). Each host's sessions now fill *lanes*: lane 0 is the
host's master connection (kept between jobs where masters are kept), and every
:data:`SESSIONS_PER_CONNECTION` live sessions more open another master of the job's own
beside it (a ControlPath with the lane's number), ended with the job. Short commands
(the job's files, what comes back at the end) go through lane 0, within the room left.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Protocol

from .connection import SshOptions, on_each

# sshd's default MaxSessions is 10: two left on each connection for short commands
SESSIONS_PER_CONNECTION = 8


class Session(Protocol):
    def poll(self) -> int | None: ...


class Lanes:
    """Which connection to each host a new session goes through, and what to end."""

    def __init__(self, options: SshOptions, timeout: float):
        self.options = options  # lane 0's
        self.timeout = timeout
        self._sessions: dict[tuple[str, int], list[Session]] = defaultdict(list)
        self._forwards: dict[tuple[str, int], list[str]] = defaultdict(list)
        self._opened: set[tuple[str, int]] = set()  # lanes > 0 with a master open

    def options_of(self, lane: int) -> SshOptions:
        """The options that go through ``lane``'s master (lane 0: the host's own)."""
        if lane == 0 or not self.options.control_path:
            return self.options
        path = f"{self.options.control_path}-{lane}"
        return dataclasses.replace(self.options, control_path=path, keep=0)

    def choose(self, host: str) -> tuple[int, SshOptions]:
        """The first lane to ``host`` with room for one more session (its master opened
        if it is a new one of the job's)."""
        lane = 0
        while self.options.control_path and self._live(host, lane) >= SESSIONS_PER_CONNECTION:
            lane += 1
        options = self.options_of(lane)
        if lane and (host, lane) not in self._opened:
            options.open_master(host, timeout=self.timeout)
            self._opened.add((host, lane))
        return lane, options

    def add(self, host: str, lane: int, session: Session, forwards: list[str]) -> None:
        """Record a session started through ``lane`` with these ``-R`` forwards."""
        self._sessions[(host, lane)].append(session)
        self._forwards[(host, lane)].extend(forwards)

    def _live(self, host: str, lane: int) -> int:
        return sum(session.poll() is None for session in self._sessions[(host, lane)])

    def close(self, hosts: list[str]) -> None:
        """End the job's connections to ``hosts``: its own masters, and lane 0's too
        unless it is kept (then only the forwards the job's sessions left on it go)."""
        if self.options.keep:
            kept = [key for key in self._forwards if key[1] == 0]
            on_each(kept, lambda key: self.options.cancel_forwards(key[0], self._forwards[key]))
        else:
            on_each(hosts, self.options.close_master)
        on_each(sorted(self._opened), lambda key: self.options_of(key[1]).close_master(key[0]))
        self._opened.clear()
        self._sessions.clear()
        self._forwards.clear()
