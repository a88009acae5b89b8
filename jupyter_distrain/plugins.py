"""Backends and launchers are plugins found by short name through entry points.

Design decision
---------------

- **Plugins**: launchers and backends are entry points
  (`jupyter_distrain.launchers`, `jupyter_distrain.backends`) found by short
  name (`plugins.py`); a new one needs no change to the core. A process reads a
  group's entry points once (reading them reads every installed distribution's
  metadata, ~15 ms, three times per job in the kernel and three in the supervisor);
  a name it has not seen makes it read them again, so a plugin installed while a
  kernel runs is found. `--backend auto`
  resolves to the first available backend in `backends.choice.BACKEND_PREFERENCE`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from .contract.spec import JobSpec, SpecError

if TYPE_CHECKING:
    from .backends.base import Backend
    from .launchers.base import LauncherKind, LauncherOption

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


def launcher_kind(name: str) -> type[LauncherKind]:
    """The submit-time part of launcher ``name`` (its runtime class's :attr:`kind`)."""
    return load_plugin(LAUNCHERS, name).kind


@functools.cache
def launcher_options() -> dict[str, list[tuple[str, LauncherOption]]]:
    """Every option the launchers declare (``LauncherKind.declared_options``), by option
    name, with each launcher declaring it (in entry-point order); launchers sharing a name
    share its flag. A launcher that cannot be imported is left out (logged)."""
    options: dict[str, list[tuple[str, LauncherOption]]] = {}
    for name in plugin_names(LAUNCHERS):
        try:
            launcher = launcher_kind(name)
        except Exception as exc:  # a broken plugin must not take the others' jobs down
            log.warning("launcher %s left out: it cannot be imported (%s)", name, exc)
            continue
        for option in launcher.declared_options:
            options.setdefault(option.name, []).append((name, option))
    return options


def check_launcher_options(spec: JobSpec) -> JobSpec:
    """``spec`` with its launcher options checked as the launchers declaring them check
    them (``spec.launcher``'s own declaration where it shares the name), and those equal
    to their defaults left out; a name no launcher declares, a bad value, or an option
    of another launcher given a value is a :class:`SpecError`."""
    given: dict[str, Any] = spec.launcher_options
    if not given:
        return spec
    declared = launcher_options()
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise SpecError(
            f"{unknown[0]!r} is not an option of any launcher (they take: "
            f"{', '.join(sorted(declared))})"
        )
    for name, owners in declared.items():
        if name in given:
            own = [option for owner, option in owners if owner == spec.launcher]
            (own or [owners[0][1]])[0].validate(given[name])
    for name, owners in declared.items():
        first_owner, option = owners[0]
        elsewhere = spec.launcher not in (owner for owner, _ in owners)
        if name in given and elsewhere and option.only_for and given[name] != option.default:
            raise SpecError(
                f"{option.flag_name} is for {option.only_for}: add --launcher {first_owner}"
            )
    kept = {name: value for name, value in given.items() if value != declared[name][0][1].default}
    return dataclasses.replace(spec, launcher_options=kept)


def check_support(backend: Backend, launcher: type[LauncherKind]) -> None:
    """Raise :class:`SpecError` (one line) when the job needs of its launcher what the
    launcher does not give: the backend's needs met with the launcher's capabilities, the
    one place either is asked."""
    for capability, asked in backend.needs().items():
        if capability not in launcher.supports:
            why = launcher.why_not.get(capability, " yet")
            raise SpecError(f"{asked} is not supported by --launcher {launcher.name}{why}")
