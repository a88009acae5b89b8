"""Compiled programs kept across runs: a re-run of an unchanged cell reuses what the last
run compiled instead of compiling it again in its new processes.

Each framework's cache lives in this user's cache (``contract.private.cache_dir``:
``~/.cache/jupyter_distrain/``, 0700), one directory per Python environment and
framework version (:func:`versioned_dir`): a new version starts empty and the
environment's directories of earlier versions are removed. A job's ``--env`` naming the
framework's own setting wins. Set when (if ever) the program imports the framework.

- **JAX** (and Keras 3 on JAX) compiles every ``jit``-ed function with XLA in each new
  process: for a small Keras model most of a warm re-run's time to its first step. Its
  persistent compilation cache is switched on (``xla/``), kept under
  :data:`JAX_CACHE_BYTES` by JAX (least recently used entries go), every compilation kept
  (JAX's default keeps only those over a second). JAX writes from rank 0 alone, which
  serves every rank where their keys agree (GPUs); on CPU each process has keys of its
  own and writes its own entries (:func:`_every_cpu_process_writes`). JAX bounds it with
  ``filelock`` (in the ``jax`` extra): without it, no cache.
  ``--env JAX_COMPILATION_CACHE_DIR=...`` puts it elsewhere,
  ``JAX_ENABLE_COMPILATION_CACHE=false`` switches it off. Each process reports how many
  of its compilations the cache answered (``compiled_programs``, ``reused_programs`` in
  ``metrics.jsonl``, from JAX's monitoring events), which the widget says ("13 of 13
  compiled programs reused").
- **torch.compile**: Inductor keeps its FX graph and kernel caches under
  ``$TMPDIR/torchinductor_<user>``, which in a job is the job's own temporary directory
  (``worker/__main__.py``), gone with the job: every run compiled everything again (26 s
  to a small model's first step here, 5.4 s with the cache). ``TORCHINDUCTOR_CACHE_DIR``
  now points at ``torchinductor/``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import logging
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..contract.metrics import reporter
from ..contract.private import cache_dir
from .patching import patch_on_import

log = logging.getLogger(__name__)

JAX_CACHE_BYTES = 2 << 30
REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"


def versioned_dir(cache: str, *packages: str) -> Path:
    """This Python environment's directory in the user's cache ``cache`` for the installed
    versions of ``packages``; the environment's directories of other versions removed."""
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    versions = "-".join(metadata.version(package) for package in packages)
    parent = cache_dir(cache)
    for old in parent.glob(f"{environment}-*"):
        if old.name != f"{environment}-{versions}":
            shutil.rmtree(old, ignore_errors=True)
    path = parent / f"{environment}-{versions}"
    path.mkdir(exist_ok=True, mode=0o700)
    return path


class CompileCounts:
    """Counts a process's compilations and those the cache answered, reported as they
    change."""

    def __init__(self) -> None:
        self.compiled = self.reused = 0

    def event(self, name: str, **_: Any) -> None:
        if name not in (REQUESTS, HITS):
            return
        if name == REQUESTS:
            self.compiled += 1
        else:
            self.reused += 1
        sender = reporter()
        if sender is not None:
            record = {"compiled_programs": self.compiled, "reused_programs": self.reused}
            sender.report({**record, "time": time.time()})


def use_jax_cache(jax: Any) -> None:
    """Point JAX (imported, nothing compiled yet) at this user's cache unless the job's
    environment says otherwise, and count what it reuses."""
    told = {name for name in os.environ if name.startswith("JAX_")}
    if importlib.util.find_spec("filelock") is None and "JAX_COMPILATION_CACHE_DIR" not in told:
        log.warning("jupyter_distrain: no compilation cache for JAX (pip install filelock)")
        return  # JAX bounds its cache only with it: unbounded, it would fill the home
    try:
        if "JAX_COMPILATION_CACHE_DIR" not in told:
            kept = versioned_dir("xla", "jax", "jaxlib")
            jax.config.update("jax_compilation_cache_dir", str(kept))
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in told:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        if "JAX_COMPILATION_CACHE_MAX_SIZE" not in told:
            jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_BYTES)
    except (OSError, AttributeError, metadata.PackageNotFoundError) as exc:
        log.warning("jupyter_distrain: no compilation cache for JAX (%s)", exc)
        return  # an unusable home, an older JAX
    jax.monitoring.register_event_listener(CompileCounts().event)
    _every_cpu_process_writes()


CACHE_WRITE = ["cache_key", "compile_time_secs", "module_name", "backend", "executable"]


def _every_cpu_process_writes() -> None:
    """On CPU, let every process keep what it compiled, not rank 0 alone.

    JAX writes only from process 0, so that processes do not contend for the same entries.
    On CPU no two processes have the same entry: the key hashes the topology each process
    sees, its own devices (on GPU the keys agree and rank 0's entries serve every rank).
    Left alone, rank 0 would reuse its programs and the others compile theirs every run,
    the job's first step waiting for them. Done where JAX's private ``_cache_write`` takes
    the arguments it took when this was written (JAX 0.10), else left as JAX does it."""
    from jax._src import compilation_cache, compiler, distributed
    from jax._src import config as settings

    original = getattr(compiler, "_cache_write", None)
    if original is None or list(inspect.signature(original).parameters)[:5] != CACHE_WRITE:
        return

    @functools.wraps(original)
    def cache_write(
        cache_key: str,
        compile_time_secs: float,
        module_name: str,
        backend: Any,
        executable: Any,
        host_callbacks: Any,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        original(cache_key, compile_time_secs, module_name, backend, executable,
                 host_callbacks, *args, **kwargs)  # fmt: skip
        least = settings.persistent_cache_min_compile_time_secs.value
        if (
            distributed.global_state.process_id
            and getattr(backend, "platform", "") == "cpu"
            and not host_callbacks
            and compile_time_secs >= least
        ):
            try:
                compilation_cache.put_executable_and_time(
                    cache_key, module_name, executable, backend, int(compile_time_secs)
                )
            except Exception as exc:  # noqa: BLE001  (as JAX's own write: a warning)
                log.warning("jupyter_distrain: a compiled program was not kept (%s)", exc)

    compiler._cache_write = cache_write


def use_torch_cache(torch: Any) -> None:
    """Point torch.compile's Inductor caches at this user's cache unless the job's
    environment names them (read when it first compiles, so a pooled process, which
    imported torch before its job, gets it too)."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    try:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(versioned_dir("torchinductor", "torch"))
    except (OSError, metadata.PackageNotFoundError) as exc:
        log.warning("jupyter_distrain: no compilation cache for torch.compile (%s)", exc)


def install() -> None:
    """Keep compiled programs across runs for the frameworks the program imports."""
    patch_on_import("jax", use_jax_cache)
    patch_on_import("torch", use_torch_cache)
