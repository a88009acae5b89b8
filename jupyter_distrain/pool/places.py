"""Where the notebook's jobs started pools elsewhere (ssh hosts, Ray clusters), kept in
a JSON file per kind in the local pools' directory, so ``%distributed pool`` can list
and clear them later."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

from ..contract.private import write_atomic
from .client import pools_dir


def remember(file: str, place: str, entry: Any) -> None:
    """Note in ``file`` that ``place`` (reached as ``entry`` says) may have a pool of ours."""
    base = pools_dir(create=True)
    with open(base / (file + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        places = remembered(file)
        if places.get(place) != entry:
            places[place] = entry
            write_atomic(base / file, json.dumps(places, indent=1))


def remembered(file: str, root: Path | None = None) -> dict[str, Any]:
    """The places ``file`` remembers, each with its entry ({} when none)."""
    try:
        places = json.loads((pools_dir(root) / file).read_text())
    except (OSError, ValueError):
        return {}
    return places if isinstance(places, dict) else {}
