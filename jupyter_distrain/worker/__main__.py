"""Worker bootstrap: ``python -m jupyter_distrain.worker``.

Loads the program (the job's ``train.py``, or ``--script``), reports to the
supervisor, then runs in the mode the backend chose:

- ``train`` (default): the program runs as ``__main__``, with the variables
  pushed from the notebook as globals; on rank 0 the value bound to ``result``
  is stored when the job has ``--out``.
- ``server``: a TensorFlow server for ParameterServerStrategy's worker and ps
  tasks; it serves until the supervisor stops it.
- ``tf1_run`` (``seed`` before): Cloudera's ``run_cluster`` contract: the program defines
  ``run(cluster, server, task_index)``; ps tasks join their server, workers
  call ``run``. TF1 graph mode, as such programs expect.

Design decision
---------------

- **A worker's temporary files are the job's.** The bootstrap points `TMPDIR` (and
  `tempfile.tempdir`, for pooled processes) at `<job>/tmp/<role>-<index>/` (0700)
  unless the job's `--env` sets it: TensorFlow's AutoGraph writes
  `__autograph_generated_file*.py` with `delete=False` and removes them only at exit,
  so every stopped (SIGKILLed) worker left two in `/tmp` (found by
  `benchmarks/soak.py`); now they go with the job under the retention rule. The price
  is longer paths for programs that put Unix sockets under `tempfile` (the 108-byte
  limit): not seen yet, to watch. What frameworks compile is kept across runs in the
  user's cache instead (:mod:`.compile_cache`).
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

from ..contract import control, metrics
from ..contract import process as contract
from ..contract.keys import own_key, prove
from ..contract.process import Env, Mode, ProcessId, WorkerChannels
from ..contract.session import Cell
from ..contract.spec import JobSpec
from ..contract.store import JobDir
from . import (
    allocator,
    compile_cache,
    horovod_hook,
    instrument,
    jax_hook,
    keras_hook,
    session,
    stacks,
    threads,
    torch_hook,
)


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (fd level) to its own log file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def use_job_tmp(job: JobDir, spec: JobSpec, me: ProcessId) -> None:
    """Give this process a temporary directory in the job's directory (``TMPDIR`` and
    ``tempfile``), unless the job's ``--env`` sets ``TMPDIR``: what a stopped or killed
    process leaves there (TensorFlow's ``__autograph_generated_file*.py``, removed only at
    a clean exit) goes with the job under the store's retention rule, not into ``/tmp``."""
    if "TMPDIR" in spec.env:
        return
    path = job.path / "tmp" / str(me)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        print(f"jupyter_distrain: temporary files in the default place: {exc}", file=sys.stderr)
        return
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)  # a pooled process may have asked for the default already


def _tell_supervisor(
    channels: WorkerChannels, key: str, body: dict[str, Any], quiet: bool = False
) -> bool:
    """Send ``body`` with this process's proof (``key``: ``contract/keys.py``); whether
    the supervisor took it (``quiet``: say nothing when not)."""
    if not channels.control:
        return True
    try:
        reply = control.request(channels.control, channels.secret, prove(key, body))
    except (OSError, ValueError) as exc:
        if not quiet:
            print(f"jupyter_distrain: cannot reach the supervisor: {exc}", file=sys.stderr)
        return False
    return reply.get("error") != control.NO_REPLY


def load_program(job: JobDir, spec: JobSpec) -> tuple[Path, CodeType]:
    """The program to run: ``--script`` (resolved here, on the worker) or train.py."""
    path = Path(spec.script).expanduser() if spec.script else job.train_file
    return path, compile(path.read_text(), str(path), "exec")


def _save_result(job: JobDir, namespace: dict[str, Any]) -> None:
    import cloudpickle

    job.write_result(
        cloudpickle.dumps({"defined": "result" in namespace, "value": namespace.get("result")})
    )


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


def run_tf1(namespace: dict[str, Any]) -> None:
    """Cloudera's contract: ps tasks join, workers call ``run(cluster, server, task_index)``."""
    import json

    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    role, index = tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.compat.v1.train.ClusterSpec(tf_config["cluster"])
    server = tf.compat.v1.train.Server(cluster, job_name=role, task_index=index)
    if role == "ps":
        server.join()
        return
    namespace["run"](cluster, server, index)
    if index != 0:
        # the chief's session may still need this task's server (a TF1 session opened
        # without device filters asks every task): serve until the chief ends, when the
        # supervisor stops the rest
        print(f"jupyter_distrain: worker {index} done; serving until the chief ends", flush=True)
        server.join()


def run_program(
    job: JobDir,
    path: Path,
    program: CodeType,
    mode: str,
    rank: int,
    serve_session: Callable[[CodeType, dict[str, Any]], int] | None = None,
) -> int:
    """Execute the program in a fresh ``__main__`` namespace; return the exit code. In a
    session (``serve_session``) the program is its cell 0, and the rank then runs later
    cells in the same namespace until it is stopped (:mod:`.session`)."""
    sys.argv = [str(path)]
    sys.path.insert(0, os.getcwd())
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(path)}
    namespace.update(job.read_pushed())
    try:
        if mode == Mode.SERVER:
            serve_tf_server()
            return 0
        if mode == Mode.TF1_RUN:
            import tensorflow as tf

            tf.compat.v1.disable_eager_execution()  # TF1 programs build graphs
        if serve_session is not None:
            return serve_session(program, namespace)
        exec(program, namespace)
        if mode == Mode.TF1_RUN:
            run_tf1(namespace)
    except SystemExit as exc:
        return _exit_code(exc.code)
    except BaseException as exc:
        # drop this bootstrap's own frame: the traceback starts in the user's program
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    finally:
        torch_hook.settle()  # before the namespace goes (a process group may go with it)
    if rank == 0 and os.environ.get(Env.OUT) and serve_session is None:
        try:
            _save_result(job, namespace)
        except Exception as exc:
            print(f"jupyter_distrain: cannot send `result` back: {exc}", file=sys.stderr)
            return 1
    return 0


def _exit_code(code: object) -> int:
    """What ``sys.exit(code)`` means as a process's exit status (0-255): a message is
    printed and means 1; a number outside 0-255 would be taken modulo 256 (256 -> 0,
    a failure reported as success), so it means 1 too."""
    if code is None or isinstance(code, bool):
        return int(bool(code))
    if isinstance(code, int) and 0 <= code <= 255:
        return code
    if isinstance(code, int):
        print(
            f"jupyter_distrain: exit code {code} is out of range 0-255: exiting with 1",
            file=sys.stderr,
        )
    else:
        print(code, file=sys.stderr)
    return 1


def main() -> int:
    if os.environ.get(Env.IDENTITY_FROM_MPI):  # mpirun gave every host the same paths
        contract.expand_host_paths(os.environ)
    channels = WorkerChannels.from_env()
    if channels is None:
        print(f"jupyter_distrain: {Env.JOB_DIR} is not set: not started by a job", file=sys.stderr)
        return 2
    job = JobDir(channels.job_dir)
    try:
        job.check_private()  # what is in it is about to be run and unpickled
    except OSError as exc:
        print(f"jupyter_distrain: {exc}", file=sys.stderr)
        return 2
    me: ProcessId = contract.identity_from(os.environ)
    key = own_key(me)  # first: nothing this process starts inherits it
    rank = contract.rank_from(os.environ)
    os.environ[Env.RANK] = str(rank)  # the user's program may read it
    if os.environ.get(Env.IDENTITY_FROM_MPI):  # one of mpirun's ranks: its own log
        os.environ.update(contract.identity_env(me, None))
        if os.environ.get(Env.RANK_OUTPUT) != "mpirun":
            _redirect_output(job.log_file(me))
    try:
        spec = job.read_spec()
        path, program = load_program(job, spec)
    except (OSError, SyntaxError, ValueError) as exc:
        print(f"jupyter_distrain: cannot load the program: {exc}", file=sys.stderr)
        return 2  # never said hello: the supervisor counts this process as not started
    use_job_tmp(job, spec, me)
    # before the hello: once up, the supervisor may ask for a checkpoint at any moment, and
    # SIGUSR1's default action would end the process
    signal.signal(signal.SIGUSR1, instrument.request_checkpoint)
    stacks.install(
        str(me),
        me.describe(),
        stacks.own_roots(channels.job_dir, path),
        lambda answer: _tell_supervisor(channels, key, contract.stacks_taken(me, answer)),
    )
    # a native crash (segfault, abort, bus error) writes the crashing thread's Python
    # stack to the log before the process dies: the cell shows where it was, not a code
    faulthandler.enable(all_threads=False)
    address = os.environ.get(Env.ADDRESS, "")
    mode = Mode.from_env(os.environ)
    serve_session = None
    if spec.session is not None and mode == Mode.TRAIN:  # a session's rank: cells follow
        first = Cell(0, "", out=bool(spec.out), out_all=spec.out_all)
        tell = functools.partial(_tell_supervisor, channels, key, quiet=True)
        serve_session = functools.partial(session.serve, job.path, me, rank, first, tell=tell)
    hello = contract.hello(
        me, os.getpid(), socket.gethostname(), address, cells=serve_session is not None
    )
    _tell_supervisor(channels, key, hello)
    metrics.reporter()  # heartbeats from now on: silence means a hung process
    threads.share_cores(mode)
    if os.environ.get(Env.BACKEND) == "torch":
        allocator.keep_freed_memory()
    if os.environ.get(Env.INSTRUMENT, "1") != "0" and channels.metrics and mode != Mode.SERVER:
        keras_hook.install()
        torch_hook.install()
    jax_hook.install()
    compile_cache.install()
    torch_hook.install_store_wait()
    horovod_hook.install(
        elastic=bool(os.environ.get("HOROVOD_ELASTIC")),
        convert_horovod=os.environ.get(Env.HOROVOD_AUTOGRAPH) == "1",
    )
    code = run_program(job, path, program, mode, rank, serve_session)
    # Python gives SIGUSR1 back its default action while it shuts down: a checkpoint
    # request arriving then would kill the process that just checkpointed
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    sys.stdout.flush()
    sys.stderr.flush()
    metrics.close_reporter()  # the last records arrive before the bye
    _tell_supervisor(channels, key, contract.bye(me, os.getpid(), code))
    return code


if __name__ == "__main__":
    sys.exit(main())
