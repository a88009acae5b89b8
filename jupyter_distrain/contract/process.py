"""The supervisor/worker contract: process identity, environment names, message shapes.

Everything the supervisor and a worker process must agree on lives here; both
sides import it, and neither spells an environment name or a message field on
its own. The job directory's layout is the other half of the contract
(:class:`jupyter_distrain.contract.store.JobDir`, used by both sides too), and the
control file that says where the supervisor listens (:class:`.control.ControlInfo`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .control import CONTROL_FILE, ControlInfo
from .handoff import received

CHECKPOINT_EXIT = 75  # a worker that exits with this code checkpointed on request


@dataclass(frozen=True, order=True)
class ProcessId:
    """Which process of a job: its role (``worker``, ``chief``, ``ps``, ``mpirun``) and
    its index within the role. Rows, logs, metrics and control messages all use it."""

    role: str
    index: int

    def __str__(self) -> str:
        return f"{self.role}-{self.index}"

    @classmethod
    def parse(cls, text: str) -> ProcessId:
        """The inverse of ``str()``: ``"worker-1"`` -> ``ProcessId("worker", 1)``."""
        role, sep, index = text.rpartition("-")
        if not sep or not role or not index.isdigit():
            raise ValueError(f"not a process id: {text!r} (expected ROLE-INDEX, e.g. worker-1)")
        return cls(role, int(index))

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> ProcessId | None:
        """The id named by a message's or record's ``role``/``index`` fields, if well formed."""
        role, index = fields.get("role"), fields.get("index")
        if not isinstance(role, str) or not isinstance(index, int) or isinstance(index, bool):
            return None
        return cls(role, index)

    def fields(self) -> dict[str, Any]:
        """The ``role``/``index`` fields that name this process in messages and records."""
        return {"role": self.role, "index": self.index}

    def describe(self) -> str:
        """How messages name the process: "rank 1" for workers, "ps 0", "chief"."""
        if self.role == "worker":
            return f"rank {self.index}"
        return self.role if self.role == "chief" else f"{self.role} {self.index}"


class JaxEnv:
    """What ``--backend jax`` sets beside JAX's own ``JAX_COORDINATOR_ADDRESS``: the
    process count and ids, read by the cluster environment ``worker/jax_hook.py``
    registers with JAX."""

    PROCESS_COUNT = "JAX_NUM_PROCESSES"
    PROCESS_ID = "JAX_PROCESS_ID"
    LOCAL_PROCESS_ID = "JAX_LOCAL_PROCESS_ID"


class Env:
    """The environment names of the contract (all ``JUPYTER_DISTRAIN_*``)."""

    ROOT = "JUPYTER_DISTRAIN_ROOT"  # where job directories live (user setting)
    JOB_DIR = "JUPYTER_DISTRAIN_JOB_DIR"
    CONTROL = "JUPYTER_DISTRAIN_CONTROL"  # host:port of the supervisor's control server
    METRICS = "JUPYTER_DISTRAIN_METRICS"  # tcp://host:port of the metrics collector
    BACKEND = "JUPYTER_DISTRAIN_BACKEND"
    OUT = "JUPYTER_DISTRAIN_OUT"  # set when rank 0 must store ``result``
    BATCH_SIZE = "JUPYTER_DISTRAIN_BATCH_SIZE"
    CHECKPOINT_EVERY = "JUPYTER_DISTRAIN_CHECKPOINT_EVERY"  # --checkpoint-every: "50" or "30s"
    ROLE = "JUPYTER_DISTRAIN_ROLE"
    INDEX = "JUPYTER_DISTRAIN_INDEX"
    RANK = "JUPYTER_DISTRAIN_RANK"  # set by the worker itself for the user's program
    ADDRESS = "JUPYTER_DISTRAIN_ADDRESS"  # the address other processes reach this one on
    # how many of the job's processes share this one's host (worker/threads.py)
    HOST_PROCESSES = "JUPYTER_DISTRAIN_HOST_PROCESSES"
    MODE = "JUPYTER_DISTRAIN_MODE"  # a Mode: what the worker does with its program
    INSTRUMENT = "JUPYTER_DISTRAIN_INSTRUMENT"  # "0" turns the Keras instrumentation off
    # MPI path: one mpirun starts every rank; each names itself from its MPI rank
    IDENTITY_FROM_MPI = "JUPYTER_DISTRAIN_IDENTITY_FROM_MPI"
    # "mpirun": such a rank leaves its output to mpirun (which tags it by rank), rather
    # than writing its own log file (on another host that file would stay there)
    RANK_OUTPUT = "JUPYTER_DISTRAIN_RANK_OUTPUT"
    # "1": let AutoGraph convert Horovod's own functions, as TensorFlow does by default
    # (user setting; a worker skips them otherwise: see worker/horovod_hook.py)
    HOROVOD_AUTOGRAPH = "JUPYTER_DISTRAIN_HOROVOD_AUTOGRAPH"
    # how many processes one local job may have, in place of 4 per core (user setting:
    # benchmarks/control_plane.py simulates a large job's control plane with it)
    LOCAL_PROCESS_LIMIT = "JUPYTER_DISTRAIN_LOCAL_PROCESS_LIMIT"
    # the warm worker pool (user settings)
    POOL = "JUPYTER_DISTRAIN_POOL"  # "0" turns it off
    POOL_SIZE = "JUPYTER_DISTRAIN_POOL_SIZE"  # idle processes per pool, at most
    POOL_IDLE = "JUPYTER_DISTRAIN_POOL_IDLE"  # seconds a pool stays unused before it ends
    POOL_MEMORY = "JUPYTER_DISTRAIN_POOL_MEMORY"  # GiB all idle processes of a pool may hold
    # "0": refill when the job ends, not one run ahead at claim time (to measure it)
    POOL_AHEAD = "JUPYTER_DISTRAIN_POOL_AHEAD"
    # seconds an ssh connection to a host is kept after its last session (user setting;
    # "0": each job opens and closes its own)
    SSH_KEEP = "JUPYTER_DISTRAIN_SSH_KEEP"
    # the job store's retention rule (user settings; "inf" keeps everything)
    KEEP_JOBS = "JUPYTER_DISTRAIN_KEEP_JOBS"  # finished jobs kept, newest first (200)
    KEEP_DAYS = "JUPYTER_DISTRAIN_KEEP_DAYS"  # days a finished job is kept (30)
    # how often the server extension tells Jupyter a job runs (user setting; "0": never)
    ACTIVITY_SECONDS = "JUPYTER_DISTRAIN_ACTIVITY_SECONDS"
    # the descriptor of what a process is handed in memory (see handoff.py)
    HANDOFF_FD = "JUPYTER_DISTRAIN_HANDOFF_FD"
    # the process's own key (contract/keys.py), and a helper's members' keys (JSON)
    KEY = "JUPYTER_DISTRAIN_KEY"
    KEYS = "JUPYTER_DISTRAIN_KEYS"


class Mode:
    """What a worker does with its program (``Env.MODE``; the backend chooses)."""

    TRAIN = "train"  # the default: run it as ``__main__``
    SERVER = "server"  # serve a TensorFlow server (ParameterServerStrategy's tasks)
    TF1_RUN = "tf1_run"  # Cloudera's TF1 contract: the program defines run(cluster, server,
    # task_index); workers call it, ps tasks join their server

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> str:
        """The worker's mode (:attr:`TRAIN` unless the backend set another)."""
        return environ.get(Env.MODE, cls.TRAIN)


# A job directory (and the channels' sockets in it) may be given as a template that each
# host completes: mpirun hands every rank the same environment, on every host.
HOST_PLACEHOLDER = "{hostname}"


def expand_host_path(value: str) -> str:
    """``value`` with ``{hostname}`` replaced by this host's name and a leading ``~``
    (after a ``unix:`` or ``ipc://`` scheme, if any) by the home directory."""
    import socket

    scheme = next((s for s in ("unix:", "ipc://") if value.startswith(s)), "")
    path = value[len(scheme) :].replace(HOST_PLACEHOLDER, socket.gethostname())
    return scheme + os.path.expanduser(path)


def expand_host_paths(environ: MutableMapping[str, str]) -> None:
    """Complete the job directory and channel templates in ``environ``, in place."""
    for key in (Env.JOB_DIR, Env.CONTROL, Env.METRICS):
        if key in environ:
            environ[key] = expand_host_path(environ[key])


# Where a process's rank comes from, first found wins.
_RANK_SOURCES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK", Env.INDEX)


def rank_from(environ: Mapping[str, str]) -> int:
    """The process's rank: MPI's or Horovod's when set, else its index in its role."""
    for key in _RANK_SOURCES:
        if key in environ:
            return int(environ[key])
    return 0


def identity_from(environ: Mapping[str, str]) -> ProcessId:
    """Which process this is, from the environment the supervisor gave it."""
    if environ.get(Env.IDENTITY_FROM_MPI):
        return ProcessId("worker", rank_from(environ))
    return ProcessId(environ.get(Env.ROLE, "worker"), int(environ.get(Env.INDEX, "0")))


def identity_env(pid: ProcessId, address: str | None) -> dict[str, str]:
    """The variables that tell a launched process who it is."""
    env = {Env.ROLE: pid.role, Env.INDEX: str(pid.index)}
    if address:
        env[Env.ADDRESS] = address
    return env


@dataclass(frozen=True)
class WorkerChannels:
    """How a worker reaches its supervisor: the job directory and the two channels.

    The secret is never in the environment (a subprocess of the cell would inherit
    it, and printing the environment would show it): a worker reads it from the job
    directory's private control file, or from what it was handed in memory (on Ray
    nodes: :mod:`.handoff`)."""

    job_dir: str
    control: str  # unix:/path or tcp:host:port
    metrics: str  # ipc:///path or tcp://host:port
    secret: str = ""

    def env(self) -> dict[str, str]:
        return {Env.JOB_DIR: self.job_dir, Env.CONTROL: self.control, Env.METRICS: self.metrics}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerChannels | None:
        """The channels given to this process, with the job's secret; None outside a job."""
        environ = os.environ if environ is None else environ
        if Env.JOB_DIR not in environ:
            return None
        handed = received(Env.HANDOFF_FD) if environ is os.environ else None
        if handed is not None:
            secret = handed.secret
        else:
            control = ControlInfo.read(Path(environ[Env.JOB_DIR]) / CONTROL_FILE)
            secret = control.secret if control is not None else ""
        return cls(
            environ[Env.JOB_DIR], environ.get(Env.CONTROL, ""), environ.get(Env.METRICS, ""), secret
        )


# --- requests over the control channel -----------------------------------------------
class Op:
    """The ``op`` of a control request: what a worker or the notebook asks the supervisor."""

    HELLO = "hello"  # a worker is up (:func:`hello`)
    BYE = "bye"  # a worker is about to exit (:func:`bye`)
    STATUS = "status"  # the state the supervisor saved last
    SCALE = "scale"  # resize the job (:func:`scale_request`)
    STOP = "stop"  # stop the job (:func:`stop_request`)
    STOP_PROCESSES = "stop_processes"  # stop some processes (:func:`stop_processes_request`)
    STACKS = "stacks"  # every live process's stacks, now (:func:`stacks_request`)
    STACKS_TAKEN = "stacks_taken"  # a worker's answer to a stacks request (:func:`stacks_taken`)
    # a session's cells (``contract/session.py``)
    CELL = "cell"  # the notebook wrote a cell for every rank (the supervisor relays it)
    CELL_DONE = "cell_done"  # a rank ran a cell
    CELL_STATUS = "cell_status"  # which ranks ran a cell, and how
    CELL_RESULT = "cell_result"  # the result one rank sent with its answer
    INTERRUPT = "interrupt"  # KeyboardInterrupt in every rank's running cell


def hello(
    pid_: ProcessId, pid: int, host: str, address: str, cells: bool = False
) -> dict[str, Any]:
    """A worker is up: its program is loaded and about to run; ``cells``: it runs a
    session's cells (a TensorFlow server task of a session does not)."""
    body = {"op": Op.HELLO, **pid_.fields(), "pid": pid, "host": host, "address": address}
    return {**body, "cells": True} if cells else body


def bye(pid_: ProcessId, pid: int, code: int) -> dict[str, Any]:
    """A worker is about to exit with ``code`` (how a process we did not start reports it)."""
    return {"op": Op.BYE, **pid_.fields(), "pid": pid, "code": code}


def scale_request(workers: int) -> dict[str, Any]:
    """Ask the supervisor to resize the job to ``workers`` workers."""
    return {"op": Op.SCALE, "workers": workers}


def stop_request(reason: str) -> dict[str, Any]:
    """Ask the supervisor to stop the job, for ``reason`` (recorded in its events)."""
    return {"op": Op.STOP, "reason": reason}


def stacks_request(native: bool = False) -> dict[str, Any]:
    """Ask the supervisor for the stacks of every live process (``contract/stacks.py``);
    ``native``: with each one's native frames (py-spy)."""
    return {"op": Op.STACKS, "native": native}


def stacks_taken(pid_: ProcessId, stacks: dict[str, Any]) -> dict[str, Any]:
    """A worker's stacks, taken when the supervisor asked (a ``ProcessStacks`` dict)."""
    return {"op": Op.STACKS_TAKEN, **pid_.fields(), "stacks": stacks}


def stop_processes_request(processes: list[ProcessId]) -> dict[str, Any]:
    """Ask the supervisor to stop these processes of the job."""
    return {"op": Op.STOP_PROCESSES, "processes": sorted(str(p) for p in processes)}


# --- records a worker sends over the metrics channel ----------------------------------
# {"role", "index", "time", "step", "images", "images_per_sec", "loss", "total_steps", ...}
# a heartbeat: {"role", "index", "time", "heartbeat": true}


def metric_number(value: Any) -> float | int | None:
    """A metric's value as the views may use it: a finite number, else None (a record
    is written by user code: "abc", NaN or a bool must not break a table or a chart)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None
