"""Worker bootstrap: ``python -m jupyter_distrain.worker``.

Reports to the supervisor, loads the variables pushed from the notebook, runs
the job's ``train.py`` as ``__main__`` and, on rank 0, stores the value the cell
bound to ``result`` when the job was started with ``--out``.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from .. import control


def _rank() -> int:
    for key in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK", "JUPYTER_DISTRAIN_INDEX"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (fd level) to its own log file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _tell_supervisor(op: str, **body: Any) -> None:
    address = os.environ.get("JUPYTER_DISTRAIN_CONTROL")
    if not address:
        return
    host, _, port = address.rpartition(":")
    try:
        control.request(host, int(port), os.environ["JUPYTER_DISTRAIN_SECRET"], {"op": op, **body})
    except OSError as exc:
        print(f"jupyter_distrain: cannot reach the supervisor: {exc}", file=sys.stderr)


def _save_result(job_dir: Path, namespace: dict[str, Any]) -> None:
    import cloudpickle

    value = namespace.get("result")
    tmp = job_dir / f".result.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        cloudpickle.dump({"defined": "result" in namespace, "value": value}, f)
    os.replace(tmp, job_dir / "result.pkl")


def run_train(job_dir: Path, rank: int) -> int:
    """Execute train.py in a fresh ``__main__`` namespace; return the exit code."""
    train = job_dir / "train.py"
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(train)}
    push = job_dir / "push.pkl"
    if push.exists():
        with open(push, "rb") as f:
            namespace.update(pickle.load(f))
    sys.argv = [str(train)]
    sys.path.insert(0, os.getcwd())
    try:
        code = compile(train.read_text(), str(train), "exec")
        exec(code, namespace)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        # drop this bootstrap's own frame: the traceback starts in train.py
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    if rank == 0 and os.environ.get("JUPYTER_DISTRAIN_OUT"):
        try:
            _save_result(job_dir, namespace)
        except Exception as exc:
            print(f"jupyter_distrain: cannot send `result` back: {exc}", file=sys.stderr)
            return 1
    return 0


def main() -> int:
    job_dir = Path(os.environ["JUPYTER_DISTRAIN_JOB_DIR"])
    rank = _rank()
    os.environ["JUPYTER_DISTRAIN_RANK"] = str(rank)
    if os.environ.get("JUPYTER_DISTRAIN_LOG_PER_RANK"):  # one of mpirun's ranks
        os.environ["JUPYTER_DISTRAIN_ROLE"] = "worker"
        os.environ["JUPYTER_DISTRAIN_INDEX"] = str(rank)
        _redirect_output(job_dir / "logs" / f"worker-{rank}.log")
    me = {
        "role": os.environ.get("JUPYTER_DISTRAIN_ROLE", "worker"),
        "index": int(os.environ.get("JUPYTER_DISTRAIN_INDEX", rank)),
    }
    _tell_supervisor(
        "hello",
        **me,
        pid=os.getpid(),
        host=socket.gethostname(),
        address=os.environ.get("JUPYTER_DISTRAIN_ADDRESS", ""),
    )
    code = run_train(job_dir, rank)
    sys.stdout.flush()
    sys.stderr.flush()
    _tell_supervisor("bye", **me, code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
