"""What makes ``jax.distributed.initialize()`` work with no arguments in a job's process.

JAX takes the process count and id from the first "cluster environment" (a subclass
of ``jax._src.clusters.ClusterEnv``) that says it is present, the way it finds Slurm or
Open MPI. When (if ever) the program imports JAX, one is registered here that reads the
variables ``backends/jax.py`` sets. Where ``GLOO_SOCKET_IFNAME`` names the job's
interface, JAX's CPU collectives (Gloo) are made on it: left to itself Gloo takes the
address the host name resolves to, which on many hosts is loopback. Nothing here
imports JAX.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..contract.process import JaxEnv
from .patching import patch_on_import


def _register_cluster(clusters: Any) -> None:
    class JupyterDistrainCluster(clusters.ClusterEnv):
        """A job of jupyter_distrain's ``--backend jax``."""

        name = "jupyter_distrain"

        @classmethod
        def is_env_present(cls) -> bool:
            return JaxEnv.PROCESS_COUNT in os.environ and "JAX_COORDINATOR_ADDRESS" in os.environ

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None, override_coordinator_port: str | None
        ) -> str:
            return os.environ["JAX_COORDINATOR_ADDRESS"]

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ[JaxEnv.PROCESS_COUNT])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ[JaxEnv.PROCESS_ID])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # devices are given per process by CUDA_VISIBLE_DEVICES (--gpus), so JAX must
            # not narrow them again; the local id is kept for programs that read it
            return None

    # first: a job's process may also carry Open MPI's or Slurm's variables
    clusters.ClusterEnv._cluster_types.remove(JupyterDistrainCluster)
    clusters.ClusterEnv._cluster_types.insert(0, JupyterDistrainCluster)


def _gloo_on_the_job_interface(lib: Any) -> None:
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    jax_lib = getattr(lib, "_jax", None)
    original = getattr(jax_lib, "make_gloo_tcp_collectives", None)
    if not interface or original is None:
        return

    @functools.wraps(original)
    def make_gloo_tcp_collectives(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("hostname") is None and kwargs.get("interface") is None:
            kwargs["interface"] = interface
        return original(*args, **kwargs)

    jax_lib.make_gloo_tcp_collectives = make_gloo_tcp_collectives


def install() -> None:
    """Prepare JAX for the job when (if ever) the program imports it (jax jobs only)."""
    if JaxEnv.PROCESS_COUNT not in os.environ:
        return
    patch_on_import("jax._src.clusters", _register_cluster)
    patch_on_import("jax._src.lib", _gloo_on_the_job_interface)
