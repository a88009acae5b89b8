"""A session's rank: run the job's program as cell 0, then each later cell in the same
namespace, until the session is stopped (``contract/session.py`` says how cells come).

Between cells the rank sits at its prompt, polling for the next cell's file every few
milliseconds; an interrupt (SIGINT, sent by the supervisor to every rank) raises
``KeyboardInterrupt`` only inside a running cell, and is ignored at the prompt, so a
rank interrupted just as its cell ended is back at its prompt all the same.
"""

from __future__ import annotations

import linecache
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

from ..contract import session as cells
from ..contract.private import write_atomic
from ..contract.process import ProcessId
from ..contract.session import Cell, CellState

IDLE_SECONDS = 5.0  # at the prompt this long, a rank polls less often
IDLE_POLL_SECONDS = 0.01
ANSWER_SECONDS = 30.0  # how long a rank tries to hand its answer to the supervisor


class SessionEnded(Exception):
    """A cell called ``sys.exit``: the rank exits with :attr:`code`."""

    def __init__(self, code: object):
        super().__init__(code)
        self.code = code


def _ignore(signum: int, frame: Any) -> None:
    """SIGINT at the prompt: the cell it was meant for has ended already."""


def compile_cell(cell: Cell) -> CodeType:
    """The cell's code, compiled under a name its tracebacks show, with its lines."""
    name = f"<session cell {cell.index}>"
    linecache.cache[name] = (len(cell.code), None, cell.code.splitlines(True), name)
    return compile(cell.code, name, "exec")


def run_cell(
    program: CodeType, namespace: dict[str, Any], interrupted: Callable[[], bool]
) -> tuple[str, str]:
    """Run one cell in ``namespace``: its state, and the one-line error when it failed
    (the traceback goes to the rank's log). ``sys.exit`` raises :class:`SessionEnded`.
    ``interrupted``: whether the cell was interrupted before this rank took it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if interrupted():  # after the handler is set: a later SIGINT raises instead
            raise KeyboardInterrupt
        exec(program, namespace)
    except SystemExit as exc:
        raise SessionEnded(exc.code) from None
    except BaseException as exc:
        signal.signal(signal.SIGINT, _ignore)  # a second interrupt cannot cut the report short
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        if isinstance(exc, KeyboardInterrupt):
            return CellState.INTERRUPTED, "KeyboardInterrupt"
        return CellState.ERROR, "".join(traceback.format_exception_only(exc)).strip()
    finally:
        signal.signal(signal.SIGINT, _ignore)
        sys.stdout.flush()
        sys.stderr.flush()
    return CellState.OK, ""


def _result(job_path: Path, cell: Cell, me: ProcessId, namespace: dict[str, Any]) -> bytes:
    """The cell's ``result`` as the notebook unpickles it, kept in the job directory."""
    import cloudpickle

    data = cloudpickle.dumps({"defined": "result" in namespace, "value": namespace.get("result")})
    path = cells.out_file(job_path, cell.index, me)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomic(path, data)
    return data


def wait_for_cell(job_path: Path, index: int) -> Cell:
    """The next cell, once it has been handed over (polling)."""
    idle_from = time.monotonic()
    while True:
        cell = cells.read_cell(job_path, index)
        if cell is not None:
            return cell
        idle = time.monotonic() - idle_from > IDLE_SECONDS
        time.sleep(IDLE_POLL_SECONDS if idle else cells.PROMPT_POLL_SECONDS)


def pushed_for(job_path: Path, cell: Cell) -> dict[str, Any]:
    """The notebook values pushed for ``cell`` (the job directory is private)."""
    if not cell.pushed:
        return {}
    with open(cells.push_file(job_path, cell.index), "rb") as f:
        return pickle.load(f)


def serve(
    job_path: Path,
    me: ProcessId,
    rank: int,
    first: Cell,
    program: CodeType | str,
    namespace: dict[str, Any],
    tell: Callable[[dict[str, Any]], bool],
) -> int:
    """Run cell 0 (``first``, whose ``program`` is the job's), then every later cell, in
    ``namespace``; return the exit code a cell's ``sys.exit`` asked for."""
    signal.signal(signal.SIGINT, _ignore)
    # a process may inherit SIGINT blocked (a Ray worker starts the node's agent so), and
    # then an interrupt would wait for ever
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    cell = first
    while True:
        state, error, result = CellState.ERROR, "", None
        if isinstance(program, str):
            error = program  # the cell could not be taken
        else:
            try:
                marked = cells.interrupt_file(job_path, cell.index).exists
                state, error = run_cell(program, namespace, marked)
            except SessionEnded as end:
                answer(tell, cells.cell_done(me, cell.index, CellState.OK))
                raise SystemExit(end.code) from None
            if state == CellState.OK and cell.returns_result(rank):
                try:
                    result = _result(job_path, cell, me, namespace)
                except Exception as exc:
                    state, error = CellState.ERROR, f"cannot send `result` back: {exc}"
                    print(f"jupyter_distrain: {error}", file=sys.stderr, flush=True)
        answer(tell, cells.cell_done(me, cell.index, state, error, result))
        cell = wait_for_cell(job_path, cell.index + 1)
        program = _take(job_path, cell, namespace)


def answer(tell: Callable[[dict[str, Any]], bool], body: dict[str, Any]) -> None:
    """Send a cell's answer until the supervisor takes it (a connection refused while
    every slot is busy is tried again: the notebook waits for every rank's answer)."""
    pause = 0.01
    deadline = time.monotonic() + ANSWER_SECONDS
    while not tell(body):
        if time.monotonic() > deadline:
            print("jupyter_distrain: the supervisor took no answer", file=sys.stderr, flush=True)
            return
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _take(job_path: Path, cell: Cell, namespace: dict[str, Any]) -> CodeType | str:
    """The cell's program, its pushed values put in ``namespace``; or why it cannot run."""
    try:
        namespace.update(pushed_for(job_path, cell))
        return compile_cell(cell)
    except (OSError, SyntaxError, ValueError, pickle.UnpicklingError) as exc:
        print(f"jupyter_distrain: cell {cell.index}: {exc}", file=sys.stderr, flush=True)
        return f"cell {cell.index} could not be taken: {exc}"
