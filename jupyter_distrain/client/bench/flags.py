"""The flags of ``%distributed bench`` and ``jupyter-distrain bench``, and the settings
they give."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from ...contract.spec import SpecError
from ..flags import add_launcher_arguments, launcher_flags, launcher_options
from .settings import BACKENDS, BenchSettings


def add_arguments(parser: Any, defaults: Mapping[str, Any] | None = None) -> None:
    """The bench flags, shared by the magic and the command line. ``defaults``: the
    ``%%distributed`` flags' defaults as the config files set them
    (:func:`jupyter_distrain.client.config.flag_defaults`); the launcher flags take theirs from
    them, as the cell's do."""
    parser.add_argument("--workers", type=int, default=2, help="worker counts 1..N (default 2)")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: horovod, tf, ps (async), ps-sync",
    )
    parser.add_argument(
        "--ps", default="1", help="parameter-server counts for ps and ps-sync, comma-separated"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16, help="filters per convolution")
    parser.add_argument("--blocks", type=int, default=2, help="residual blocks")
    parser.add_argument("--batch-size", type=int, default=32, help="images per worker step")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (the first warms up)")
    parser.add_argument("--launcher", default="local", help="local, ssh or ray")
    add_launcher_arguments(parser)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    launchers = {"launcher"} | {flag.dest for flag in launcher_flags()}
    parser.set_defaults(**{k: v for k, v in (defaults or {}).items() if k in launchers})


def settings_from(args: argparse.Namespace) -> BenchSettings:
    """Settings from parsed :func:`add_arguments` flags; a bad list is a SpecError."""
    try:
        ps = [int(p) for p in str(args.ps).split(",") if p.strip()]
    except ValueError:
        raise SpecError(f"--ps must be comma-separated whole numbers, got {args.ps!r}") from None
    # the flags are named after the settings (--batch-size -> batch_size)
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(BenchSettings)
        if f.name != "launcher_options"
    }
    given["launcher_options"] = launcher_options(args)
    given["backends"] = [b.strip() for b in str(args.backends).split(",") if b.strip()]
    given["ps"] = ps
    return BenchSettings(**given).validate()
