"""A session's cells: how the notebook hands a cell to every rank, and how ranks answer.

A session (``--session NAME``) is a job whose ranks stay up between cells. Its first
cell is the job's ``train.py`` (cell 0); each later cell is written into the job
directory as ``session/N.json`` (its code and options), with the values pushed for it
beside it (``session/N.push.pkl``) and the ``.json`` written last, atomically: a rank at
its prompt polls for the next index's file, so a local rank starts a cell within
milliseconds of its writing. Ranks on other hosts get the same files from the
supervisor through their host's agent (``Op.CELL``).

A rank answers each cell with ``Op.CELL_DONE``: ``ok``, ``error`` (its traceback is in
its log) or ``interrupted``, with its own proof (``contract/keys.py``): the supervisor
files an answer only from the process it names, and only for a cell the notebook has
written. Rank 0 (every rank, with ``out_all``) leaves the cell's ``result`` in
``session/N.<process>.out.pkl``, sends its SHA-256 ``digest`` in the answer, and the
result itself inline too when it is small (a rank on another host has its own copy of
the directory). The notebook asks for the answers (``Op.CELL_STATUS``: states and
digests, bounded whatever the number of ranks), then for each result it wants on its own
(``Op.CELL_RESULT``), and unpickles a result only when the cell asked for it and its
bytes have the digest the proven answer gave.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .private import write_atomic
from .process import Op, ProcessId

CELLS_DIR = "session"
INLINE_OUT_BYTES = 32 * 1024  # a result sent inline in a CELL_DONE (control lines: 64 KiB)
ERROR_CHARS = 2000  # of a rank's one-line error, kept with its answer
ERRORS_SAID = 4  # failed ranks whose errors a status reply carries (the first by rank)
PROMPT_POLL_SECONDS = 0.002  # how often a rank at its prompt looks for the next cell
SCALE_REFUSED = (
    "a session's variables live in its ranks, and a resize restarts them: stop the "
    "session and start it again with --workers N, then run its cells again"
)


class CellState:
    """How a rank's run of a cell ended."""

    OK = "ok"
    ERROR = "error"  # the cell raised: its traceback is in the rank's log
    INTERRUPTED = "interrupted"  # KeyboardInterrupt (an interrupt, or the session's stop)


@dataclass(frozen=True)
class Cell:
    """One cell of a session, as every rank runs it."""

    index: int
    code: str
    out: bool = False  # rank 0 sends back the value bound to ``result``
    out_all: bool = False  # every rank does
    pushed: bool = False  # values pushed from the notebook are beside it

    def returns_result(self, rank: int) -> bool:
        """Whether the process of ``rank`` sends back its ``result``."""
        return self.out_all or (self.out and rank == 0)


def cells_dir(job_path: Path) -> Path:
    return job_path / CELLS_DIR


def cell_file(job_path: Path, index: int) -> Path:
    return cells_dir(job_path) / f"{index}.json"


def push_file(job_path: Path, index: int) -> Path:
    return cells_dir(job_path) / f"{index}.push.pkl"


def out_file(job_path: Path, index: int, process: ProcessId) -> Path:
    return cells_dir(job_path) / f"{index}.{process}.out.pkl"


def write_cell(job_path: Path, cell: Cell, pushed: bytes | None = None) -> None:
    """Hand ``cell`` to the ranks of this host (the pushed values first: a rank reads
    them once it sees the cell)."""
    cells_dir(job_path).mkdir(mode=0o700, exist_ok=True)
    if pushed is not None:
        write_atomic(push_file(job_path, cell.index), pushed)
    write_atomic(cell_file(job_path, cell.index), json.dumps(asdict(cell)))


def read_cell(job_path: Path, index: int) -> Cell | None:
    """Cell ``index`` once it has been handed over; None before."""
    try:
        data = json.loads(cell_file(job_path, index).read_text())
        return Cell(**data)
    except FileNotFoundError:
        return None


def interrupt_file(job_path: Path, index: int) -> Path:
    """Written before a cell's ranks are sent SIGINT: a rank that takes the cell after
    the signal came does not run it."""
    return cells_dir(job_path) / f"{index}.interrupt"


def mark_interrupted(job_path: Path, index: int) -> dict[str, bytes]:
    """Mark cell ``index`` interrupted here; the file, for other hosts."""
    path = interrupt_file(job_path, index)
    cells_dir(job_path).mkdir(mode=0o700, exist_ok=True)
    write_atomic(path, b"")
    return {str(path.relative_to(job_path)): b""}


def cell_files(job_path: Path, index: int) -> dict[str, bytes]:
    """Cell ``index``'s files, by their path in the job directory (what the supervisor
    relays to other hosts), the cell itself last."""
    files = {}
    for path in (push_file(job_path, index), cell_file(job_path, index)):
        if path.exists():
            files[str(path.relative_to(job_path))] = path.read_bytes()
    return files


def is_cell_file(name: str) -> bool:
    """Whether ``name`` (a path in a job directory) is one a cell relay may write."""
    parts = name.split("/")
    return (
        len(parts) == 2
        and parts[0] == CELLS_DIR
        and parts[1].endswith((".json", ".push.pkl", ".interrupt"))
        and parts[1].split(".")[0].isdigit()
    )


# --- requests over the control channel -----------------------------------------------
def cell_request(index: int) -> dict[str, Any]:
    """The notebook wrote cell ``index``: relay it to the ranks on other hosts."""
    return {"op": Op.CELL, "cell": index}


def digest(data: bytes) -> str:
    """What an answer says of its result's bytes."""
    return hashlib.sha256(data).hexdigest()


def cell_done(
    process: ProcessId, index: int, state: str, error: str = "", result: bytes | None = None
) -> dict[str, Any]:
    """A rank ran cell ``index``; ``result``: its pickled ``result`` (its digest always,
    the bytes too when small enough)."""
    body = {"op": Op.CELL_DONE, **process.fields(), "cell": index, "state": state}
    if error:
        body["error"] = error[:ERROR_CHARS]
    if result is not None:
        body["digest"] = digest(result)
        if len(result) <= INLINE_OUT_BYTES:
            body["result"] = base64.b64encode(result).decode()
    return body


def cell_status_request(index: int) -> dict[str, Any]:
    """Ask which ranks ran cell ``index``, and how."""
    return {"op": Op.CELL_STATUS, "cell": index}


def cell_result_request(index: int, process: ProcessId) -> dict[str, Any]:
    """Ask for the result ``process`` sent inline with its answer to cell ``index``."""
    return {"op": Op.CELL_RESULT, "cell": index, "process": str(process)}


def interrupt_request() -> dict[str, Any]:
    """Ask for a KeyboardInterrupt in every rank's running cell."""
    return {"op": Op.INTERRUPT}
