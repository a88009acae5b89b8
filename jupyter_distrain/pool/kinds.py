"""Which jobs a pool serves, and the part of the environment that must match.

A pool is kept per (interpreter, kind, what it runs): the installed versions of the
libraries the kind imports and of this package (its source files' sizes and times too,
for an editable install), so that an upgrade or an edit is never served by processes
that imported the old code. The kind says what a pooled process imports
ahead of time; a job's processes can be pooled when its backend imports the same.
A pooled process imported its libraries with the environment of the job that asked
for the pool: a later job takes it when what the libraries and the interpreter read as
they start is the same (:func:`import_env`: the names the frameworks, their math
libraries and the interpreter read then, and nothing set per job); the rest of the job's
environment (the kernel's own variables, a ``--env`` the frameworks read later) is the
process's from the claim on, as a cold process would have had it. So a variable a kernel
gains (``TORCHELASTIC_SIGNALS_TO_HANDLE``, left by Accelerate's ``notebook_launcher``)
keeps its pool warm; one that changes an import (``OMP_NUM_THREADS``, ``XLA_FLAGS``)
does not, and the cell says which.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from ..contract.process import Env, JaxEnv
from ..frameworks import TENSORFLOW_DISTRIBUTIONS, installed_version
from ..version import __version__

WORKER_MODULE = "jupyter_distrain.worker"  # what a pooled process becomes: the worker bootstrap

# backend -> the kind of pooled process that serves it
KIND_OF_BACKEND = {
    "horovod": "horovod", "tf": "tensorflow", "ps": "tensorflow", "torch": "torch", "jax": "jax",
}  # fmt: skip

_KERAS = ["keras"] if importlib.util.find_spec("keras") is not None else []
_KERAS_AND_ITS_TENSORFLOW = _KERAS + (
    ["tensorflow"] if _KERAS and importlib.util.find_spec("tensorflow") is not None else []
)

# what each kind imports before it waits (module names, in order)
PREIMPORTS = {
    "tensorflow": ["numpy", "tensorflow"],
    "horovod": ["numpy", "tensorflow", "horovod.tensorflow", "horovod.tensorflow.keras"],
    # nothing initialised; DistributedDataParallel's constructor imports torch._dynamo
    # (1.5 s of a 2-rank re-run's 1.9 s to its first step here)
    "torch": ["numpy", "torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"],
    # no device touched (jax.distributed.initialize must come first); Keras 3 on JAX too,
    # and TensorFlow where installed beside it: keras.distribution.initialize() seeds
    # TensorFlow's generator as well, importing it (1.6 s of a warm 2-rank Keras 3 job's
    # 2.5 s to its first step here)
    "jax": ["numpy", "jax", "jax.numpy"] + _KERAS_AND_ITS_TENSORFLOW,
}

# the distributions behind each pre-imported module (and what TensorFlow imports itself)
_DISTRIBUTIONS = {
    "numpy": [("numpy",)],
    "tensorflow": [TENSORFLOW_DISTRIBUTIONS, ("keras",), ("tf-keras",)],
    "horovod.tensorflow": [("horovod",)],
    "torch": [("torch",)],
    "torch._dynamo": [("sympy",)],
    "jax": [("jax",), ("jaxlib",)],
    "keras": [("keras",)],
}
_PACKAGE_DIR = Path(__file__).resolve().parent.parent

# set per job or per process, read after import (by hvd.init, the TF runtime, the
# worker bootstrap): a pooled process takes them at claim time
# (an ssh session's SSH_CONNECTION names its client's port: new for every connection)
_PER_JOB_PREFIXES = ("JUPYTER_DISTRAIN_", "HOROVOD_", "OMPI_", "PMI_", "JPY_", "SSH_")
_PER_JOB_NAMES = {"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "PWD", "OLDPWD"}
# torchrun's variables (backends/torch.py), read by init_process_group
_PER_JOB_NAMES |= {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS", "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}  # fmt: skip
# JAX's and Keras's (backends/jax.py), read by jax.distributed.initialize
_PER_JOB_NAMES |= {
    "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_BIND_ADDRESS", JaxEnv.PROCESS_COUNT,
    JaxEnv.PROCESS_ID, JaxEnv.LOCAL_PROCESS_ID, "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID",
}  # fmt: skip


# what libraries read as they are imported, and the interpreter as it starts (locale,
# time zone, home: Keras's config; a temporary directory cached on first use)
_IMPORT_PREFIXES = (
    "TF_", "TF2_", "XLA_", "JAX_", "TPU_", "CUDA_", "NCCL_", "NVIDIA_", "CUBLAS_", "CUDNN_",
    "KERAS_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "OMP_", "KMP_", "MKL_",
    "OPENBLAS_", "NUMEXPR_", "VECLIB_", "GRPC_", "PYTHON", "LD_", "MALLOC_", "GLIBC_", "LC_",
)  # fmt: skip
_IMPORT_NAMES = {"HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"}
# how a claim refused for its environment begins (the launcher says it to the user)
ENV_DIFFERS = "the pool's processes were imported with another"


def read_at_import(name: str) -> bool:
    """Whether the variable ``name`` can change what a pooled process imported: read by
    a library or the interpreter as it starts, and not set per job or per process."""
    if _per_job(name):
        return False
    return name in _IMPORT_NAMES or name.startswith(_IMPORT_PREFIXES)


def _per_job(name: str) -> bool:
    return name in _PER_JOB_NAMES or name.startswith(_PER_JOB_PREFIXES)


def without_per_job(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less what is set per job or per process: what a pool's processes import
    with (the job that asked for the pool had it)."""
    return {k: v for k, v in env.items() if not _per_job(k)}


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` that a pooled process must have had when it imported (the
    pool's key); the rest is given to it when a job claims it."""
    return {k: v for k, v in env.items() if read_at_import(k)}


def import_differences(ours: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The names whose values at import differ between two environments (names only:
    a value may be a secret)."""
    mine, other = import_env(ours), import_env(theirs)
    return sorted(k for k in mine.keys() | other.keys() if mine.get(k) != other.get(k))


def source_fingerprint(package: Path = _PACKAGE_DIR) -> str:
    """This package's source files, cheaply: how many, their total size, the newest
    modification time (an edit of an editable install changes it; nothing is read)."""
    count = size = newest = 0
    for path in package.rglob("*.py"):
        stat = path.stat()
        count, size, newest = count + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return f"{count}:{size}:{newest}"


def code_key(kind: str) -> str:
    """A digest of what a pooled process of ``kind`` runs: the installed versions of the
    libraries it imports (from package metadata: nothing is imported) and this package."""
    parts = [f"jupyter_distrain={__version__}:{source_fingerprint()}"]
    for module in PREIMPORTS[kind]:
        for distributions in _DISTRIBUTIONS.get(module, []):
            parts.append(f"{distributions[0]}={installed_version(*distributions)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


def pool_prefix(kind: str, python: str | None = None) -> str:
    """What the names of every pool of ``kind`` and the interpreter begin with."""
    digest = hashlib.sha256((python or sys.executable).encode()).hexdigest()[:10]
    return f"{kind}-{digest}-"


def pool_name(kind: str, python: str | None = None) -> str:
    """The pool's directory name: its kind, a digest of the interpreter path, and
    :func:`code_key`."""
    return pool_prefix(kind, python) + code_key(kind)


def enabled(environ: Mapping[str, str]) -> bool:
    """The user's setting: ``JUPYTER_DISTRAIN_POOL=0`` turns pools off."""
    return environ.get(Env.POOL, "1").strip().lower() not in ("0", "off", "false", "no")


def plans_ahead(env: Mapping[str, str]) -> bool:
    """Whether a job's claims keep the pool one run ahead (``JUPYTER_DISTRAIN_POOL_AHEAD=0``
    in its environment: refill when it ends instead, to measure the difference)."""
    return env.get(Env.POOL_AHEAD, "1") != "0"
