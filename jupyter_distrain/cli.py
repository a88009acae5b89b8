"""``jupyter-distrain`` (also ``jupyter distrain``): the jobs from a terminal, with no kernel.

``list | status JOB | logs JOB [--rank N] [--follow] | stop JOB | scale JOB N |
attach JOB | pool [--clear] | clean | config | bench``: the same engine and messages as the
``%distributed`` line magic (:mod:`jupyter_distrain.client.commands`); ``attach`` shows
the terminal's text view. Exit status: 0, 1 when the job shown failed, 2 for bad
arguments or a refused command (no such job, a scale the job cannot take), 130 when
interrupted. ``bench`` runs the backend comparison (:mod:`jupyter_distrain.client.bench`)
and writes its table, CSV, JSON and chart (SVG).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .client import bench, commands, config
from .client.widget import TextSummary, gpu_text
from .contract.spec import SpecError

PROG = "jupyter-distrain"


def parser(defaults: Mapping[str, Any] | None = None) -> argparse.ArgumentParser:
    """Every command's arguments; ``defaults``: the flags' defaults from the config files
    (``bench``'s launcher flags take them)."""
    top = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench_parser = commands.add_commands(sub)["bench"]
    bench.add_arguments(bench_parser, defaults)
    bench_parser.add_argument("--out", default=None, help="also copy the results here")
    return top


def main(argv: list[str] | None = None) -> int:
    try:
        settings = commands.settings()  # the config files' settings, for every command
        args = parser(config.flag_defaults(settings)).parse_args(argv)
        if args.command == "bench":
            return _bench(args)
        code, _ = commands.run(args, PROG, TextSummary, gpu_text)
        return code
    except commands.CommandError as exc:
        text = str(exc)
        print(text if text.startswith(PROG) else f"{PROG}: {text}", file=sys.stderr)
        return commands.EXIT_USAGE
    except KeyboardInterrupt:
        return commands.EXIT_INTERRUPTED


def _bench(args: argparse.Namespace) -> int:
    try:  # bad settings, or a launcher's pre-flight refusing the first run
        settings = bench.settings_from(args)
        rows, results = bench.run(settings, progress=lambda line: print(line, flush=True))
    except SpecError as exc:
        raise commands.CommandError(f"{PROG} bench: {exc}") from None
    except bench.BenchFailed as exc:
        print(f"{PROG} bench: {exc}", file=sys.stderr)
        return commands.EXIT_FAILED
    print(bench.table(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("results.csv", "results.json", "chart.svg"):
            shutil.copy(results / name, out / name)
        results = out
    print(f"results: {results}/results.csv, {results}/results.json; chart: {results}/chart.svg")
    return commands.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
