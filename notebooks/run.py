"""Execute a notebook headless (nbclient), write ``<name>.executed.ipynb`` beside it
(or in ``--out DIR``, where its kernel then also runs: a folder of your own when the
notebooks are installed read-only), and print the text its last code cell printed.

    python notebooks/run.py notebooks/01-quickstart.ipynb [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def executed_path(path: Path, out: Path | None = None) -> Path:
    """Where the executed copy of notebook ``path`` is written."""
    return (out or path.parent) / f"{path.stem}.executed.ipynb"


def execute(path: Path, out: Path | None = None, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a kernel working in ``out`` (default: the
    notebook's folder), and write the executed copy there."""
    nb = nbformat.read(path, as_version=4)
    # the kernel's channels on Unix sockets in a private folder, not TCP on localhost
    # (reachable by every account here; the kernel warns of it)
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        kernel = KernelManager(kernel_name="python3", transport="ipc", ip=f"{sockets}/ipc")
        where = {"metadata": {"path": str(out or path.parent)}}
        client = NotebookClient(nb, km=kernel, timeout=timeout, resources=where)
        try:
            client.execute()
        finally:
            nbformat.write(nb, executed_path(path, out))
    return nb


def cell_text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, help="folder for the executed copy and the kernel")
    args = parser.parse_args()
    try:
        nb = execute(args.notebook, args.out)
    except CellExecutionError as exc:
        print(f"{args.notebook} failed:\n{exc}", file=sys.stderr)
        return 1
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    print(cell_text(code_cells[-1]), end="")
    print(f"executed notebook: {executed_path(args.notebook, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
