"""Deadlines and polling: the one way this package waits for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Deadline:
    """A point in monotonic time, ``seconds`` from now; ``None`` seconds never expires."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def remaining(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())


def poll_until(
    condition: Callable[[], T], seconds: float | None, interval: float = 0.1
) -> T | None:
    """Call ``condition`` every ``interval`` s until it returns something true (returned)
    or ``seconds`` have passed (then its last value is returned)."""
    deadline = Deadline(seconds)
    while True:
        value = condition()
        if value or deadline.expired:
            return value
        time.sleep(interval)
