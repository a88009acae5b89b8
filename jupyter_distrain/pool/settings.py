"""A pool's bounds, read from the environment the keeper was started with."""

from __future__ import annotations

import dataclasses
import logging
import os

import psutil

from ..contract.process import Env

log = logging.getLogger("jupyter_distrain.pool")

DEFAULT_SIZE = 4
DEFAULT_IDLE_SECONDS = 600.0


@dataclasses.dataclass
class Settings:
    """At most ``size`` idle processes, together at most ``memory_bytes``; the pool ends
    once unused for ``idle_seconds``."""

    size: int = DEFAULT_SIZE
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    memory_bytes: int = 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> Settings:
        """``JUPYTER_DISTRAIN_POOL_SIZE``/``_IDLE``/``_MEMORY`` (GiB), or the defaults."""
        total = psutil.virtual_memory().total
        try:
            size = int(environ.get(Env.POOL_SIZE, DEFAULT_SIZE))
            idle = float(environ.get(Env.POOL_IDLE, DEFAULT_IDLE_SECONDS))
            memory = float(environ.get(Env.POOL_MEMORY, total / 4 / 2**30))
        except ValueError as exc:
            log.warning("bad pool setting (%s): using the defaults", exc)
            return cls(memory_bytes=total // 4)
        return cls(max(0, size), max(1.0, idle), int(memory * 2**30))
