"""Which jobs a pool serves, and the part of the environment that must match.

A pool is kept per (interpreter, kind). The kind says what a pooled process imports
ahead of time; a job's processes can be pooled when its backend imports the same.
A pooled process imported its libraries with the environment of the job that asked
for the pool: a later job takes it only if everything that can matter at import
time is the same (everything but what is set per job or per process, and read only
once the program runs).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Collection, Mapping

from ..contract.process import Env

# backend -> the kind of pooled process that serves it
KIND_OF_BACKEND = {"horovod": "horovod", "tf": "tensorflow", "ps": "tensorflow"}

# what each kind imports before it waits (module names, in order)
PREIMPORTS = {
    "tensorflow": ["numpy", "tensorflow"],
    "horovod": ["numpy", "tensorflow", "horovod.tensorflow", "horovod.tensorflow.keras"],
}

# set per job or per process, read after import (by hvd.init, the TF runtime, the
# worker bootstrap): a pooled process takes them at claim time
_PER_JOB_PREFIXES = ("JUPYTER_DISTRAIN_", "HOROVOD_", "OMPI_", "PMI_", "JPY_")
_PER_JOB_NAMES = {"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "PWD", "OLDPWD"}


# what a user's --env may set that libraries read when imported
_IMPORT_PREFIXES = (
    "TF_", "TF2_", "XLA_", "CUDA_", "NCCL_", "KERAS_", "OMP_", "KMP_", "MKL_", "OPENBLAS_",
    "PYTHON", "LD_", "MALLOC_", "GLIBC_",
)  # fmt: skip


def per_job_names(job_env: Mapping[str, str]) -> list[str]:
    """The names a job's ``--env`` sets that no library reads at import: a pooled process
    takes them at claim time, so a changed value does not stop it from serving."""
    return sorted(k for k in job_env if not k.startswith(_IMPORT_PREFIXES))


def import_env(env: Mapping[str, str], per_job: Collection[str] = ()) -> dict[str, str]:
    """The part of ``env`` that a pooled process must have had when it imported."""
    return {
        k: v
        for k, v in env.items()
        if k not in _PER_JOB_NAMES and k not in per_job and not k.startswith(_PER_JOB_PREFIXES)
    }


def pool_name(kind: str, python: str | None = None) -> str:
    """The pool's directory name: its kind and a digest of the interpreter path."""
    digest = hashlib.sha256((python or sys.executable).encode()).hexdigest()[:10]
    return f"{kind}-{digest}"


def enabled(environ: Mapping[str, str]) -> bool:
    """The user's setting: ``JUPYTER_DISTRAIN_POOL=0`` turns pools off."""
    return environ.get(Env.POOL, "1").strip().lower() not in ("0", "off", "false", "no")
