"""Stopping processes: SIGTERM to each tree, a grace period, then SIGKILL, all through
the launcher's handles."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

from ..contract.launch import LaunchedProcess
from ..timing import poll_until

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05


def terminate(handles: Sequence[LaunchedProcess], grace: float) -> None:
    """SIGTERM every live process's tree, SIGKILL what is left after ``grace`` seconds,
    and wait for each, so none is left a zombie."""
    live = [h for h in handles if h.alive]
    for handle in live:
        handle.signal(signal.SIGTERM, tree=True)
    poll_until(lambda: not any(h.alive for h in live), grace, POLL_SECONDS)
    for handle in live:
        if handle.alive:
            log.warning("pid %d ignored SIGTERM for %.1f s: SIGKILL", handle.pid, grace)
    for handle in handles:
        handle.signal(signal.SIGKILL, tree=True)  # stragglers that left the process group
    for handle in handles:
        handle.wait()
