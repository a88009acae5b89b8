"""Backends and launchers are plugins found by short name through entry points."""

from __future__ import annotations

from importlib.metadata import entry_points

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
