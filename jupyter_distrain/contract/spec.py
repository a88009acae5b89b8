"""JobSpec: the validated, serialisable description of one distributed job."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any


class SpecError(ValueError):
    """Bad input for a job. The message is one readable line naming the problem."""


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")  # names are fullmatch()ed
_EVERY_RE = re.compile(r"[1-9][0-9]{0,8}s?")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

CONTROLLERS = ("gloo", "mpi")
KERAS_CHOICES = ("auto", "legacy", "native")
MAX_SECONDS = 7 * 24 * 3600.0  # --timeout, --hang-timeout
MAX_GRACE = 3600.0
MAX_CPU = 4096.0
MAX_GIB = 65536.0


@dataclass
class _JobFields:
    """The fields of :class:`JobSpec` (which adds the launchers' options as keywords)."""

    code: str
    workers: int = 1
    ps: int = 0  # parameter servers (backend "ps")
    backend: str = "auto"
    launcher: str = "local"
    controller: str = "gloo"
    cpu: float | None = None
    memory: float | None = None  # GiB per worker
    env: dict[str, str] = field(default_factory=dict)
    name: str = "job"
    timeout: float = 120.0  # seconds for every worker to come up
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL on stop
    push: list[str] = field(default_factory=list)
    out: str | None = None
    out_all: bool = False  # --out binds every rank's `result` (a session's), not rank 0's
    workdir: str = field(default_factory=os.getcwd)
    python: str = ""  # interpreter for workers; "" means the supervisor's own
    script: str | None = None  # run this file (resolved on the worker) instead of train.py
    batch_size: int | None = None  # images per step, where Keras cannot tell
    hang_timeout: float = 120.0  # seconds a running process may go unheard; 0 turns it off
    stall_timeout: float = 60.0  # seconds without a step on any rank before a warning; 0: off
    max_restarts: int = 0  # restarts from the last checkpoint after a failure (as torchrun's)
    checkpoint_every: str = ""  # "50" (steps) or "30s": periodic checkpoints ("" none)
    min_workers: int = 0  # a lost host is left out while this many workers remain (0: never)
    left_out: list[str] = field(default_factory=list)  # lost hosts (nodes) the job goes without
    keras: str = "auto"  # auto, legacy (tf-keras) or native; resolved by submit
    gpus: int = 0  # GPUs per worker (and chief); ps get none
    gpu_ids: list[str] = field(default_factory=list)  # the devices to use (default: all)
    pool: bool = True  # take warm processes from a pool where one matches (--no-pool: never)
    pool_socket: str = ""  # the pool chosen at submit ("" none); set by the launcher
    # the launcher's own options, as it declares them (LauncherKind.declared_options: ssh's
    # hosts and ssh_port, Ray's ray_address, ...); only those given, the rest take defaults
    launcher_options: dict[str, Any] = field(default_factory=dict)
    placement: list[dict[str, Any]] = field(default_factory=list)  # set by the launcher
    # an interactive session (--session NAME): the ranks stay up and run later cells too
    session: str | None = None
    keep_session: bool = False  # the session outlives the kernel that started it
    owner_pid: int = 0  # the kernel that started the session: the session ends with it


class JobSpec(_JobFields):
    """Everything the supervisor needs to run a job; written to ``spec.json``.

    A launcher's options may also be given as keywords, which land in
    ``launcher_options``: ``JobSpec(code, launcher="ssh", hosts="h1:2", ssh_port=2222)``.
    The contract does not know them: the launchers that declare them check them at
    submit (:func:`jupyter_distrain.plugins.check_launcher_options`).
    """

    def __init__(self, *args: Any, **keywords: Any) -> None:
        given = {k: keywords.pop(k) for k in list(keywords) if k not in _FIELD_NAMES}
        super().__init__(*args, **keywords)
        if given:
            self.launcher_options = {**self.launcher_options, **given}

    def uses_mpirun(self) -> bool:
        """Whether one ``mpirun`` starts every rank (mpi4py, Horovod's MPI controller)."""
        return self.backend == "mpi" or (self.backend == "horovod" and self.controller == "mpi")

    def validate(self) -> JobSpec:
        """Check every field but the launcher's options (their launchers check those);
        raise :class:`SpecError` naming the first bad one."""
        if not isinstance(self.workers, int) or self.workers < 1:
            raise SpecError(f"--workers must be a whole number >= 1, got {self.workers!r}")
        if not isinstance(self.ps, int) or self.ps < 0:
            raise SpecError(f"--ps must be a whole number >= 0, got {self.ps!r}")
        if self.backend == "ps" and self.ps < 1:
            raise SpecError("--backend ps needs --ps N with N >= 1 parameter servers")
        if self.ps and self.backend not in ("auto", "ps"):
            raise SpecError(
                f"--ps is for the parameter-server backend, not --backend {self.backend}"
            )
        if self.keras not in KERAS_CHOICES:
            raise SpecError(
                f"--keras must be one of {', '.join(KERAS_CHOICES)}, got {self.keras!r}"
            )
        if self.controller not in CONTROLLERS:
            raise SpecError(
                f"--controller must be one of {', '.join(CONTROLLERS)}, got {self.controller!r}"
            )
        _number("--cpu", self.cpu, "a number of cores > 0", low=0, high=MAX_CPU, optional=True)
        _number("--memory", self.memory, "a number of GiB > 0", low=0, high=MAX_GIB, optional=True)
        if not isinstance(self.gpus, int) or isinstance(self.gpus, bool) or self.gpus < 0:
            raise SpecError(f"--gpus must be a whole number >= 0, got {self.gpus!r}")
        if self.gpu_ids and not self.gpus:
            raise SpecError("--gpu-ids needs --gpus N (the GPUs each worker gets)")
        if not isinstance(self.launcher_options, dict):
            raise SpecError(f"launcher_options must be a dict, got {self.launcher_options!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise SpecError(f"--batch-size must be >= 1, got {self.batch_size!r}")
        _number("--timeout", self.timeout, "a number of seconds > 0", low=0, high=MAX_SECONDS)
        _number("--grace", self.grace, "a number of seconds >= 0", low=None, high=MAX_GRACE)
        _number("--hang-timeout", self.hang_timeout, "seconds >= 0", low=None, high=MAX_SECONDS)
        _number("--stall-timeout", self.stall_timeout, "seconds >= 0", low=None, high=MAX_SECONDS)
        if self.checkpoint_every and not _EVERY_RE.fullmatch(str(self.checkpoint_every)):
            raise SpecError(
                "--checkpoint-every takes a number of steps (50) or of seconds (30s), "
                f"got {self.checkpoint_every!r}"
            )
        restarts = self.max_restarts
        if not isinstance(restarts, int) or isinstance(restarts, bool) or not 0 <= restarts <= 100:
            raise SpecError(f"--max-restarts must be a whole number 0-100, got {restarts!r}")
        least = self.min_workers
        if not isinstance(least, int) or isinstance(least, bool) or not 0 <= least <= self.workers:
            raise SpecError(
                f"--min-workers must be a whole number 1-{self.workers} (--workers), got {least!r}"
            )
        if least and not restarts:
            raise SpecError(
                "--min-workers needs --max-restarts N: a lost host is left out by a restart"
            )
        if not _NAME_RE.fullmatch(self.name):
            raise SpecError(
                f"--name must be 1-40 letters, digits, '_', '.' or '-', got {self.name!r}"
            )
        for key in self.env:
            if not _ENV_KEY_RE.fullmatch(key):
                raise SpecError(f"--env: {key!r} is not a valid environment variable name")
        for name in [*self.push, *([self.out] if self.out else [])]:
            if not _IDENTIFIER_RE.fullmatch(name):
                raise SpecError(f"{name!r} is not a valid Python variable name")
        self._validate_session()
        return self

    def _validate_session(self) -> None:
        if self.session is None:
            for flag, given in (("--keep-session", self.keep_session), ("--out-all", self.out_all)):
                if given:
                    raise SpecError(f"{flag} is for a session: add --session NAME")
            return
        if not _NAME_RE.fullmatch(self.session):
            raise SpecError(
                f"--session must be 1-40 letters, digits, '_', '.' or '-', got {self.session!r}"
            )
        if self.script or self.max_restarts:
            what = "--script" if self.script else "--max-restarts"
            raise SpecError(
                f"a session cannot use {what}: its ranks keep the cells' state, which a "
                "restart or another program would lose (run it as a job, without --session)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """From :meth:`to_dict`'s output; names that are not a field are left out."""
        return cls(**{k: v for k, v in data.items() if k in _FIELD_NAMES})


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(_JobFields))
JobSpec.__signature__ = inspect.signature(_JobFields)  # type: ignore[attr-defined]  # help()


def _number(
    flag: str,
    value: float | None,
    what: str,
    low: float | None,
    high: float,
    optional: bool = False,
) -> None:
    """A finite number in (low, high] (or [0, high] when ``low`` is None)."""
    if value is None and optional:
        return
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if low is not None else value >= 0)
        and value <= high
    )
    if not ok:
        raise SpecError(f"{flag} must be {what} and at most {high:g}, got {value!r}")


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    """Turn ``["K=V", ...]`` into a dict; a pair without ``=`` is a :class:`SpecError`."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def parse_names(text: str | None) -> list[str]:
    """Split ``"a,b c"`` into ``["a", "b", "c"]``."""
    if not text:
        return []
    return [n for n in re.split(r"[,\s]+", text) if n]
