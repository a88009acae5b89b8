"""Backends and launchers are plugins found by short name through entry points."""

from __future__ import annotations

import functools
import logging
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launchers.base import LauncherOption

log = logging.getLogger(__name__)

LAUNCHERS = "jupyter_distrain.launchers"
BACKENDS = "jupyter_distrain.backends"


def plugin_names(group: str) -> list[str]:
    return sorted(ep.name for ep in entry_points(group=group))


def load_plugin(group: str, name: str) -> type:
    """Load the class registered as ``name`` in entry-point ``group``."""
    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    what = group.rsplit(".", 1)[-1].rstrip("s")
    raise ValueError(f"unknown {what} {name!r}; available: {', '.join(plugin_names(group))}")


@functools.cache
def launcher_options() -> dict[str, list[tuple[str, LauncherOption]]]:
    """Every option the launchers declare (``Launcher.declared_options``), by option
    name, with each launcher declaring it (in entry-point order); launchers sharing a name
    share its flag. A launcher that cannot be imported is left out (logged)."""
    options: dict[str, list[tuple[str, LauncherOption]]] = {}
    for name in plugin_names(LAUNCHERS):
        try:
            launcher = load_plugin(LAUNCHERS, name)
        except Exception as exc:  # a broken plugin must not take the others' jobs down
            log.warning("launcher %s left out: it cannot be imported (%s)", name, exc)
            continue
        for option in launcher.declared_options:
            options.setdefault(option.name, []).append((name, option))
    return options
