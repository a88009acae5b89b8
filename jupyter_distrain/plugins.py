"""Backends and launchers are plugins found by short name through entry points."""

from __future__ import annotations

import functools
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launchers.base import LauncherOption

log = logging.getLogger(__name__)

LAUNCHERS = "jupyter_distrain.launchers"
BACKENDS = "jupyter_distrain.backends"


@functools.cache
def _registered(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name, read once per process: reading them reads
    every installed distribution's metadata (~15 ms, three times per job in the kernel
    and in the supervisor, on its way to the first step)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def plugin_names(group: str) -> list[str]:
    return sorted(_registered(group))


def load_plugin(group: str, name: str) -> type:
    """Load the class registered as ``name`` in entry-point ``group``; a name not seen
    yet is looked up again (a plugin installed while the kernel runs)."""
    found = _registered(group).get(name)
    if found is None:
        _registered.cache_clear()
        found = _registered(group).get(name)
    if found is not None:
        return found.load()
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
