"""Execute a notebook headless (nbclient), write ``<name>.executed.ipynb`` beside it,
and print the text its last code cell printed.

    python notebooks/run.py notebooks/01-quickstart.ipynb
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    finally:
        nbformat.write(nb, path.with_name(f"{path.stem}.executed.ipynb"))
    return nb


def cell_text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", type=Path)
    args = parser.parse_args()
    try:
        nb = execute(args.notebook)
    except CellExecutionError as exc:
        print(f"{args.notebook} failed:\n{exc}", file=sys.stderr)
        return 1
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    print(cell_text(code_cells[-1]), end="")
    print(f"executed notebook: {args.notebook.with_name(args.notebook.stem + '.executed.ipynb')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
