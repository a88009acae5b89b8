"""The flag table: every ``%%distributed`` flag once, with the
:class:`~jupyter_distrain.contract.spec.JobSpec` field or launcher option it sets.

The magic's arguments, its line -> spec mapping, ``bench``'s launcher flags and the
JupyterLab form's fields (:func:`flag_models`, served as ``GET /distrain/flags``) are
built from :func:`flag_table`. A launcher's flags come from its own
``declared_options`` (:class:`~jupyter_distrain.launchers.base.LauncherOption`), found
through the launchers' entry points: a new launcher option is declared there only.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython.core.magic_arguments import ArgDecorator

from .. import plugins
from ..contract.spec import (
    CONTROLLERS,
    KERAS_CHOICES,
    JobSpec,
    parse_env_pairs,
    parse_names,
)
from ..plugins import BACKENDS, LAUNCHERS, plugin_names

# a flag's kind, as magicline.ts's FlagKind: int, float, str, bool (a switch), repeat
_KINDS: dict[str, dict[str, Any]] = {
    "int": {"type": int},
    "float": {"type": float},
    "str": {},
    "bool": {"action": "store_true"},
    "repeat": {"action": "append"},
}
_KIND_OF_TYPE = {int: "int", float: "float", str: "str", bool: "bool"}
FROM_SPEC: Any = object()  # a flag's default: its JobSpec field's (declared once, there)


def _spec_default(name: str) -> Any:
    """The default of JobSpec's field ``name`` (a plain value, not a factory's)."""
    (found,) = [f for f in dataclasses.fields(JobSpec) if f.name == name]
    if found.default is dataclasses.MISSING:
        raise TypeError(f"JobSpec.{name} has no plain default: give the flag its own")
    return found.default


@dataclass(frozen=True)
class Flag:
    """One ``%%distributed`` flag: how argparse reads it, and what it sets."""

    flag: str  # "--workers"
    kind: str  # a key of _KINDS
    default: Any
    help: str
    field: str = ""  # the JobSpec field it sets
    option: str = ""  # or the launcher option it sets (JobSpec.launcher_options)
    # neither: the magic's own (--background, --all-output)
    short: str = ""  # "-n"
    metavar: str | None = None
    choices: tuple[str, ...] = ()  # checked by JobSpec.validate, with its one-line message
    to_spec: Callable[[Any], Any] | None = None  # the parsed value -> the field's
    launchers: tuple[str, ...] = ()  # a launcher option's: the launchers declaring it

    def __post_init__(self) -> None:
        if self.default is FROM_SPEC:
            object.__setattr__(self, "default", _spec_default(self.field))

    @property
    def dest(self) -> str:
        """The argparse attribute: ``--gpu-ids`` -> ``gpu_ids``."""
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        """Add it to an argparse parser (or argument group)."""
        names = [self.short, self.flag] if self.short else [self.flag]
        keywords = {**_KINDS[self.kind], "default": self.default, "help": self.help}
        if self.metavar:
            keywords["metavar"] = self.metavar
        parser.add_argument(*names, **keywords)

    def model(self) -> dict[str, Any]:
        """As plain JSON, for the JupyterLab form: the default as a line would write it
        ("" for none, a switch or a list)."""
        default = self.default
        if default is None or default is False or default in ([], ""):
            default = ""
        return {
            "name": self.flag.removeprefix("--"),
            "kind": self.kind,
            "default": f"{default:g}" if isinstance(default, float) else str(default),
            "short": self.short.removeprefix("-"),
            "help": self.help,
            "choices": list(self.choices),
            "option": self.option,
            "launchers": list(self.launchers),
        }


def _negated(value: bool) -> bool:
    return not value


def launcher_flags() -> list[Flag]:
    """The launchers' options as flags, in entry-point order (one flag per option name)."""
    flags = []
    for name, declared in plugins.launcher_options().items():
        option = declared[0][1]
        flags.append(
            Flag(
                option.flag_name,
                _KIND_OF_TYPE[option.type],
                option.default,
                option.help,
                option=name,
                metavar=option.metavar,
                launchers=tuple(owner for owner, _ in declared),
            )
        )
    return flags


@functools.cache
def flag_table() -> tuple[Flag, ...]:
    """Every ``%%distributed`` flag, in the order ``%%distributed?`` lists them."""
    backends = ", ".join(plugin_names(BACKENDS))
    return (
        Flag("--workers", "int", FROM_SPEC, "number of workers (default 1)", "workers", short="-n"),
        Flag("--ps", "int", FROM_SPEC, "parameter servers (implies --backend ps)", "ps"),
        Flag("--backend", "str", FROM_SPEC, f"auto or one of: {backends}", "backend"),
        Flag(
            "--launcher",
            "str",
            FROM_SPEC,
            f"one of: {', '.join(plugin_names(LAUNCHERS))}",
            "launcher",
        ),
        Flag(
            "--controller",
            "str",
            FROM_SPEC,
            "horovod controller: gloo (default) or mpi",
            "controller",
            choices=CONTROLLERS,
        ),
        Flag("--cpu", "float", FROM_SPEC, "CPU cores per worker (affinity/quota)", "cpu"),
        Flag("--memory", "float", FROM_SPEC, "GiB of memory per worker (enforced)", "memory"),
        Flag("--gpus", "int", FROM_SPEC, "GPUs per worker (CUDA_VISIBLE_DEVICES)", "gpus"),
        Flag(
            "--gpu-ids",
            "str",
            None,
            "the GPUs to use, comma-separated",
            "gpu_ids",
            metavar="IDS",
            to_spec=parse_names,
        ),
        Flag(
            "--env",
            "repeat",
            [],
            "environment variable (repeatable)",
            "env",
            metavar="K=V",
            to_spec=parse_env_pairs,
        ),
        Flag("--name", "str", FROM_SPEC, "job name, the prefix of its id", "name"),
        Flag("--timeout", "float", FROM_SPEC, "seconds for every worker to start", "timeout"),
        Flag("--grace", "float", FROM_SPEC, "seconds between SIGTERM and SIGKILL on stop", "grace"),
        Flag(
            "--push",
            "str",
            None,
            "notebook variables to send, comma-separated",
            "push",
            metavar="NAMES",
            to_spec=parse_names,
        ),
        Flag(
            "--out",
            "str",
            FROM_SPEC,
            "bind rank 0's `result` to this notebook variable",
            "out",
            metavar="NAME",
        ),
        Flag(
            "--out-all",
            "bool",
            FROM_SPEC,
            "with --out in a session: bind a list of every rank's `result`",
            "out_all",
        ),
        Flag(
            "--session",
            "str",
            FROM_SPEC,
            "run the cell in the interactive session NAME: started by its first cell, its "
            "ranks keep their variables for the next cells with --session NAME",
            "session",
            metavar="NAME",
        ),
        Flag(
            "--keep-session",
            "bool",
            FROM_SPEC,
            "the session outlives this kernel (another kernel finds it by its name)",
            "keep_session",
        ),
        Flag(
            "--hang-timeout",
            "float",
            FROM_SPEC,
            "fail the job when a running process is unheard this many seconds (0: never)",
            "hang_timeout",
        ),
        Flag(
            "--stall-timeout",
            "float",
            FROM_SPEC,
            "warn when no rank's step advances for this many seconds (0: never)",
            "stall_timeout",
        ),
        Flag(
            "--max-restarts",
            "int",
            FROM_SPEC,
            "after a failed, hung or lost rank, restart the job from its last checkpoint, "
            "up to N times (0: fail at once)",
            "max_restarts",
            metavar="N",
        ),
        Flag(
            "--min-workers",
            "int",
            FROM_SPEC,
            "with --max-restarts: when a host or node is lost, restart without it while at "
            "least M workers remain (0: restart at the same size)",
            "min_workers",
            metavar="M",
        ),
        Flag(
            "--checkpoint-every",
            "str",
            FROM_SPEC,
            "save a checkpoint every N steps (50) or seconds (30s), where the program saves "
            "through jupyter_distrain.torch.checkpointed: what a restart resumes from",
            "checkpoint_every",
            metavar="N|Ns",
        ),
        Flag(
            "--keras",
            "str",
            FROM_SPEC,
            "auto, legacy (tf-keras) or native: the Keras workers use on TensorFlow >= 2.16",
            "keras",
            choices=KERAS_CHOICES,
        ),
        Flag(
            "--batch-size",
            "int",
            FROM_SPEC,
            "images per step for the metrics, where Keras cannot tell",
            "batch_size",
        ),
        Flag(
            "--all-output",
            "bool",
            False,
            "print the processes' output as written (every rank's TensorFlow start-up "
            "lines, progress bars' carriage returns); the logs keep it all anyway",
        ),
        Flag(
            "--no-pool",
            "bool",
            False,
            "start every process cold, never from the warm pool",
            "pool",
            to_spec=_negated,
        ),
        *launcher_flags(),
        Flag("--background", "bool", False, "return a Job handle at once instead of waiting"),
    )


def flag_models() -> dict[str, Any]:
    """Every flag as plain JSON (``GET /distrain/flags``), in a written line's order, and
    the names ``--backend`` and ``--launcher`` take: what the JupyterLab form builds its
    fields from and reads and writes a ``%%distributed`` line with."""
    return {
        "flags": [flag.model() for flag in flag_table()],
        "backends": ["auto", *plugin_names(BACKENDS)],
        "launchers": plugin_names(LAUNCHERS),
    }


def spec_from_args(args: argparse.Namespace, code: str) -> JobSpec:
    """The (unvalidated) JobSpec that parsed ``%%distributed`` flags describe; a
    launcher option is carried only where it differs from its default."""
    fields: dict[str, Any] = {}
    for flag in flag_table():
        if flag.field:
            value = getattr(args, flag.dest)
            fields[flag.field] = flag.to_spec(value) if flag.to_spec else value
    return JobSpec(code=code, launcher_options=launcher_options(args), **fields)


def add_launcher_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """Add the launchers' flags to an argparse parser (or argument group), as ``bench``
    takes them."""
    for flag in launcher_flags():
        flag.add_to(parser)


def launcher_options(args: argparse.Namespace) -> dict[str, Any]:
    """The launcher options the parsed launcher flags set (those not at their default)."""
    given = {flag: getattr(args, flag.dest) for flag in launcher_flags()}
    return {flag.option: value for flag, value in given.items() if value != flag.default}


class flag_arguments(ArgDecorator):  # noqa: N801 (named as IPython's `argument`)
    """``@flag_arguments()``: every flag of the table, for a ``magic_arguments`` magic."""

    def add_to_parser(self, parser: Any, group: Any) -> None:
        for flag in flag_table():
            flag.add_to(group if group is not None else parser)
