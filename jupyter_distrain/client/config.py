"""Settings in Jupyter's config files: ``jupyter_distrain_config.py`` or ``.json`` in
any of Jupyter's config directories (``jupyter --paths``), read by the magic, the
command line, the server extension and :func:`jupyter_distrain.submit` alike.

Every ``%%distributed`` flag's default can be set there, and every ``JUPYTER_DISTRAIN_*``
user setting::

    # /etc/jupyter/jupyter_distrain_config.py: one file that sets the cluster for everyone
    c.Distrain.launcher = "ssh"
    c.Distrain.hosts = "node1:4,node2:4"
    c.Distrain.stall_timeout = 300.0
    c.Distrain.pool_size = 4

The precedence is flag > environment variable > config file > default. A directory
later in Jupyter's list (the system's) is overridden by one before it (the user's),
``.json`` by ``.py`` in the same directory. A bad value or an unknown name is one
line naming the file and the key (:class:`ConfigError`). The environment settings
are applied by setting their variables, where not set already, in the process that
loads the config (:func:`apply`): the processes a job starts inherit them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract.process import Env

SECTION = "Distrain"
FILE_STEM = "jupyter_distrain_config"
# flags that describe one cell, not a default anyone sets for every cell
_PER_CELL = {"env", "name", "push", "out", "background"}
_TRAIT_OF_KIND = {"int": "Integer", "float": "Float", "str": "Unicode", "bool": "Bool"}


@dataclass(frozen=True)
class EnvSetting:
    """A user setting that is an environment variable today."""

    name: str
    variable: str
    kind: str  # "int", "float" or "str"; "float" also takes "inf"
    default: Any
    help: str


ENV_SETTINGS = (
    EnvSetting("jobs_root", Env.ROOT, "str", "", "where job directories live"),
    EnvSetting("pool", Env.POOL, "str", "1", "the warm pool: 0 turns it off"),
    EnvSetting("pool_size", Env.POOL_SIZE, "int", None, "idle processes per pool, at most"),
    EnvSetting("pool_idle", Env.POOL_IDLE, "float", None, "seconds a pool stays unused"),
    EnvSetting("pool_memory", Env.POOL_MEMORY, "float", None, "GiB a pool's idle processes hold"),
    EnvSetting(
        "ssh_keep", Env.SSH_KEEP, "float", 300.0, "seconds an ssh connection is kept unused"
    ),
    EnvSetting("keep_jobs", Env.KEEP_JOBS, "float", 200.0, "finished jobs kept (inf: all)"),
    EnvSetting("keep_days", Env.KEEP_DAYS, "float", 30.0, "days a finished job is kept"),
    EnvSetting(
        "activity_seconds", Env.ACTIVITY_SECONDS, "float", 60.0,
        "how often the server reports a running job as activity (0: never)",
    ),
)  # fmt: skip


class ConfigError(ValueError):
    """A config file that cannot be used, in one line naming the file and the key."""


@dataclass(frozen=True)
class Setting:
    """One effective setting: its value and where it came from."""

    name: str
    value: Any
    source: str  # "default", "config file PATH" or "$VARIABLE"


# the variables apply() set in this process, from a file: theirs, not the environment's
_applied: dict[str, str] = {}


def _flags() -> list[Any]:
    from .flags import flag_table

    return [f for f in flag_table() if f.dest not in _PER_CELL and f.kind in _TRAIT_OF_KIND]


@functools.cache
def config_class() -> type:
    """The traitlets ``Configurable`` whose traits are the settings (``c.Distrain.NAME``)."""
    import traitlets
    from traitlets.config import Configurable

    settings = [(f.dest, f.kind, f.default, f.help) for f in _flags()]
    settings += [(e.name, e.kind, e.default, e.help) for e in ENV_SETTINGS]
    traits = {}
    for name, kind, default, text in settings:
        trait = getattr(traitlets, _TRAIT_OF_KIND[kind])(default, allow_none=True, help=text)
        traits[name] = trait.tag(config=True)
    return type(SECTION, (Configurable,), traits)


def config_files(paths: list[str] | None = None) -> list[Path]:
    """The config files there are, weakest first (the system's before the user's; in a
    directory ``.json`` before ``.py``)."""
    if paths is None:
        from jupyter_core.paths import jupyter_config_path

        paths = jupyter_config_path()
    found = []
    for directory in reversed(paths):
        for suffix in (".json", ".py"):
            path = Path(directory) / f"{FILE_STEM}{suffix}"
            if path.is_file():
                found.append(path)
    return found


def _load(path: Path) -> dict[str, Any]:
    """The ``Distrain`` section of one file, checked against the traits (read again only
    when the file changed: a cell, submit() and the CLI each ask)."""
    stat = path.stat()
    return _load_version(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _load_version(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    from traitlets import TraitError
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    loader_class = JSONFileConfigLoader if path.suffix == ".json" else PyFileConfigLoader
    try:
        config = loader_class(path.name, str(path.parent)).load_config()
    except Exception as exc:  # a syntax error, bad JSON: whatever the loader raised
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    section = dict(config.get(SECTION, {}))
    cls = config_class()
    traits, instance = cls.class_traits(), cls()
    for key, value in section.items():
        if key not in traits:
            raise ConfigError(
                f"{path}: {SECTION}.{key} is not a setting (`jupyter-distrain config` lists them)"
            )
        try:
            traits[key].validate(instance, value)
        except TraitError as exc:
            text = str(exc).split("\n")[0]
            raise ConfigError(f"{path}: {SECTION}.{key}: {text}") from None
    return section


def effective(
    environ: Mapping[str, str] | None = None, paths: list[str] | None = None
) -> dict[str, Setting]:
    """Every setting's value and source, files and environment considered (no flags)."""
    environ = os.environ if environ is None else environ
    settings = {f.dest: Setting(f.dest, f.default, "default") for f in _flags()}
    settings |= {e.name: Setting(e.name, e.default, "default") for e in ENV_SETTINGS}
    for path in config_files(paths):
        for key, value in _load(path).items():  # the cached dict: read, never changed
            settings[key] = Setting(key, value, f"config file {path}")
    for env in ENV_SETTINGS:
        value = environ.get(env.variable)
        if value is not None and _applied.get(env.variable) != value:
            settings[env.name] = Setting(env.name, value, f"${env.variable}")
    return settings


def flag_defaults(settings: Mapping[str, Setting]) -> dict[str, Any]:
    """Every configurable flag's default as the settings have it (argparse's
    ``set_defaults``)."""
    flags = {f.dest for f in _flags()}
    return {k: s.value for k, s in settings.items() if k in flags}


def apply(
    environ: MutableMapping[str, str] | None = None, paths: list[str] | None = None
) -> dict[str, Setting]:
    """Set the environment settings the config files give, where the environment does
    not (a variable the user set wins; one set here follows the files as they change);
    return every effective setting."""
    environ = os.environ if environ is None else environ
    settings = effective(environ, paths)
    for env in ENV_SETTINGS:
        ours, current = _applied.get(env.variable), environ.get(env.variable)
        if current is not None and current != ours:
            continue  # the user's own
        setting = settings[env.name]
        if setting.source.startswith("config file") and setting.value is not None:
            environ[env.variable] = _applied[env.variable] = str(setting.value)
        elif current is not None:  # set from a file that no longer says so
            del environ[env.variable], _applied[env.variable]
    return settings


def table(settings: Mapping[str, Setting]) -> str:
    """The settings as ``%distributed config`` prints them: name, value, source."""
    rows = [
        (name, "-" if s.value in (None, "") else repr(s.value), s.source)
        for name, s in settings.items()
    ]
    width = max(len(r[0]) for r in rows)
    value_width = min(40, max(len(r[1]) for r in rows))
    return "\n".join(f"{n:<{width}}  {v:<{value_width}}  {s}" for n, v, s in rows)
