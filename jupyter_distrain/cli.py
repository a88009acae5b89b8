"""``jupyter-distrain`` (also ``jupyter distrain``): the command line. ``bench`` runs the
backend comparison (:mod:`jupyter_distrain.client.bench`) and writes its table, CSV, JSON and
chart (SVG)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from .client import bench
from .contract.spec import SpecError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter-distrain", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("bench", help="images/sec and scaling efficiency per backend")
    bench.add_arguments(command)
    command.add_argument("--out", default=None, help="also copy the results into this directory")
    args = parser.parse_args(argv)
    try:  # bad settings, or a launcher's pre-flight refusing the first run
        settings = bench.settings_from(args)
        rows, results = bench.run(settings, progress=lambda line: print(line, flush=True))
    except SpecError as exc:
        print(f"jupyter-distrain bench: {exc}", file=sys.stderr)
        return 2
    print(bench.table(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("results.csv", "results.json", "chart.svg"):
            shutil.copy(results / name, out / name)
        results = out
    print(f"results: {results}/results.csv, {results}/results.json; chart: {results}/chart.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
