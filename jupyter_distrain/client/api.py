"""The engine's front door: validate a JobSpec, write the job directory, start its supervisor.

The ``%%distributed`` magic is a thin layer over :func:`submit`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.choice import NOT_TENSORFLOW, resolve_backend
from ..contract.cellcheck import check_syntax, defines_tf1_run
from ..contract.spec import JobSpec, SpecError
from ..contract.store import JobDir
from ..frameworks import resolve_keras
from ..plugins import BACKENDS, check_launcher_options, check_support, launcher_kind, load_plugin
from . import config, retention, standby
from .follow import follow
from .job import NEVER_STARTED, Job

log = logging.getLogger(__name__)


def pickle_pushed(names: list[str], namespace: Mapping[str, Any]) -> bytes | None:
    """Pickle the notebook variables named by ``--push`` (cloudpickle: lambdas work too)."""
    if not names:
        return None
    import cloudpickle

    missing = [n for n in names if n not in namespace]
    if missing:
        raise SpecError(f"--push: {', '.join(missing)} not defined in the notebook")
    try:
        return cloudpickle.dumps({n: namespace[n] for n in names})
    except Exception as exc:
        raise SpecError(f"--push: cannot pickle the pushed variables: {exc}") from None


@dataclass(frozen=True)
class Checked:
    """A spec that passed a cell's rules (:func:`check`): :func:`submit` takes it as it
    is, so the rules run once however the cell came (the magic checks its line first)."""

    spec: JobSpec


def check(spec: JobSpec) -> Checked:
    """A cell's rules, in one place: the spec's own (``JobSpec.validate``), the launchers'
    options (those at their defaults left out), the cell's syntax; a :class:`SpecError`
    (one line) where one is broken."""
    checked = check_launcher_options(spec.validate())
    check_syntax(checked.code)
    return Checked(checked)


def submit(spec: JobSpec | Checked, namespace: Mapping[str, Any] | None = None) -> Job:
    """Start a job and return its handle at once. Nothing is launched on bad input.

    ``spec`` is left as given: the job runs a copy with its backend resolved
    (``job.spec``), and ``job.backend_reason`` says why that backend was chosen.
    """
    spec = (spec if isinstance(spec, Checked) else check(spec)).spec
    try:  # the config files' environment settings (pool, retention, jobs root)
        config.apply()
    except config.ConfigError as exc:
        raise SpecError(str(exc)) from None
    try:
        launcher = launcher_kind(spec.launcher)
    except ValueError as exc:
        raise SpecError(f"--launcher: {exc}") from None
    backend, reason = resolve_backend(spec)
    if spec.session is not None and backend == "ps" and defines_tf1_run(spec.code):
        raise SpecError(
            "a session runs each cell on ranks at a prompt: a program that defines "
            "run(cluster, server, task_index) is run by its tasks as a job (no --session)"
        )
    # tf.keras's choice; Keras 3 on JAX or torch is what `import keras` gives
    keras, keras_note = ("native", "") if backend in NOT_TENSORFLOW else resolve_keras(spec.keras)
    resolved = dataclasses.replace(spec, backend=backend, keras=keras)
    planner = load_plugin(BACKENDS, backend)(resolved)
    check_support(planner, launcher)
    processes = planner.slots_needed()
    resolved = launcher.check_capacity(resolved, processes)
    resolved = launcher.choose_pool(resolved, dict(os.environ))
    pushed = pickle_pushed(resolved.push, namespace or {})
    job_dir = JobDir.create(resolved)
    try:
        if pushed is not None:
            job_dir.write_pushed(pushed)
        start_supervisor(job_dir, standby_ok=resolved.pool)
    except BaseException:  # an interrupt, say: the job says at once that it never ran
        if job_dir.supervisor_alive() is None:
            job_dir.write_state(job_dir.read_state().lost(NEVER_STARTED))
        raise
    try:  # the next job's supervisor, importing beside this one
        standby.prepare(resolved.launcher, lowered=True)
    except (OSError, ValueError) as exc:
        log.warning("no supervisor on standby: %s", exc)
    try:
        retention.apply()
    except OSError as exc:  # the store stays as it was; the job runs
        log.warning("retention: %s", exc)
    notes = ([keras_note] if keras_note else []) + launcher.notes(resolved)
    return Job(job_dir, backend_reason=reason, notes=notes)


def start_supervisor(job: JobDir, standby_ok: bool = False) -> None:
    """Spawn the job's supervisor in its own session, so it outlives the kernel.

    The job's lock is taken here and handed over, so from this moment until the
    supervisor dies the job counts as alive (``JobDir.supervisor_alive``). With
    ``standby_ok`` (a job that may start warm: not ``--no-pool``) the kernel's supervisor
    on standby takes the job where there is one (``client/standby.py``)."""
    lock = job.hold_lock()
    try:
        if standby_ok and standby.hand_over(job, lock):
            return
        with open(job.supervisor_log, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_distrain.supervisor", str(job.path)]
                + ["--lock-fd", str(lock)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lock,),
            )
    finally:
        os.close(lock)
    # reap it when it ends, so a long-lived kernel collects no zombies
    threading.Thread(target=proc.wait, daemon=True).start()


def run(spec: JobSpec, namespace: Mapping[str, Any] | None = None, **options: Any) -> Job:
    """Submit a job and follow it to its end, streaming its output; Ctrl-C stops it.
    ``options`` are :func:`jupyter_distrain.client.follow.follow`'s (``view``, ``timeout``, ...)."""
    job = submit(spec, namespace)
    follow(job, **options)
    return job
