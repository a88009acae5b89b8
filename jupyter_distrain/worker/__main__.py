"""Worker bootstrap: ``python -m jupyter_distrain.worker``.

Loads the program (the job's ``train.py``, or ``--script``), reports to the
supervisor, then runs in the mode the backend chose:

- ``train`` (default): the program runs as ``__main__``, with the variables
  pushed from the notebook as globals; on rank 0 the value bound to ``result``
  is stored when the job has ``--out``.
- ``server``: a TensorFlow server for ParameterServerStrategy's worker and ps
  tasks; it serves until the supervisor stops it.
- ``seed``: Cloudera's ``run_cluster`` contract: the program defines
  ``run(cluster, server, task_index)``; ps tasks join their server, workers
  call ``run``. TF1 graph mode, as such programs expect.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import sys
import traceback
from pathlib import Path
from types import CodeType
from typing import Any

from .. import control, instrument, metrics
from . import keras_hook


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


def load_program(job_dir: Path) -> tuple[Path, CodeType]:
    """The program to run: ``--script`` (resolved here, on the worker) or train.py."""
    spec = json.loads((job_dir / "spec.json").read_text())
    path = Path(spec["script"]).expanduser() if spec.get("script") else job_dir / "train.py"
    return path, compile(path.read_text(), str(path), "exec")


def _namespace(job_dir: Path, path: Path) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(path)}
    push = job_dir / "push.pkl"
    if push.exists():
        with open(push, "rb") as f:
            namespace.update(pickle.load(f))
    return namespace


def _save_result(job_dir: Path, namespace: dict[str, Any]) -> None:
    import cloudpickle

    tmp = job_dir / f".result.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        cloudpickle.dump({"defined": "result" in namespace, "value": namespace.get("result")}, f)
    os.replace(tmp, job_dir / "result.pkl")


def serve_tf_server() -> None:
    """A ParameterServerStrategy worker or ps task: serve until stopped."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"TensorFlow server {resolver.task_type}:{resolver.task_id} at {server.target}")
    server.join()


def run_seed(namespace: dict[str, Any]) -> None:
    """Cloudera's contract: ps tasks join, workers call ``run(cluster, server, task_index)``."""
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    role, index = tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.compat.v1.train.ClusterSpec(tf_config["cluster"])
    server = tf.compat.v1.train.Server(cluster, job_name=role, task_index=index)
    if role == "ps":
        server.join()
    else:
        namespace["run"](cluster, server, index)


def run_program(job_dir: Path, path: Path, program: CodeType, mode: str, rank: int) -> int:
    """Execute the program in a fresh ``__main__`` namespace; return the exit code."""
    sys.argv = [str(path)]
    sys.path.insert(0, os.getcwd())
    namespace = _namespace(job_dir, path)
    try:
        if mode == "server":
            serve_tf_server()
            return 0
        if mode == "seed":
            import tensorflow as tf

            tf.compat.v1.disable_eager_execution()  # TF1 programs build graphs
        exec(program, namespace)
        if mode == "seed":
            run_seed(namespace)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        # drop this bootstrap's own frame: the traceback starts in the user's program
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
    try:
        path, program = load_program(job_dir)
    except (OSError, SyntaxError, ValueError) as exc:
        print(f"jupyter_distrain: cannot load the program: {exc}", file=sys.stderr)
        return 2  # never said hello: the supervisor counts this process as not started
    _tell_supervisor(
        "hello",
        **me,
        pid=os.getpid(),
        host=socket.gethostname(),
        address=os.environ.get("JUPYTER_DISTRAIN_ADDRESS", ""),
    )
    mode = os.environ.get("JUPYTER_DISTRAIN_MODE", "train")
    signal.signal(signal.SIGUSR1, instrument.request_checkpoint)
    instrumented = os.environ.get("JUPYTER_DISTRAIN_INSTRUMENT", "1") != "0"
    if instrumented and os.environ.get("JUPYTER_DISTRAIN_METRICS") and mode != "server":
        keras_hook.install()
    code = run_program(job_dir, path, program, mode, rank)
    sys.stdout.flush()
    sys.stderr.flush()
    metrics.close_reporter()  # the last records arrive before the bye
    _tell_supervisor("bye", **me, pid=os.getpid(), code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
