"""CPU and memory limits for local processes.

``--cpu C`` becomes CPU affinity (ceil(C) cores per worker, spread over the
cores this process may use) plus thread-count variables so TensorFlow does not
oversubscribe; where the cgroup ``cpu`` controller is writable (root on most
Linux machines) a fractional C also becomes a CFS quota. ``--memory`` is
enforced by the supervisor's monitor, which samples each worker's resident set
(children included) and stops a worker that goes over.

Design decision
---------------

- **`--memory`** is enforced by sampling each worker's resident set (with its
  children) every 0.5 s; over the limit, the worker is SIGKILLed and the job
  fails with "worker 1 exceeded 2.0 GiB". RLIMIT_AS was rejected: TensorFlow
  reserves far more virtual memory than it uses. **`--cpu C`** pins each worker
  to ceil(C) cores (round robin over the cores we may use), sets
  `OMP_NUM_THREADS`/`TF_NUM_INTRAOP_THREADS`/`TF_NUM_INTEROP_THREADS`, and for a
  fractional C adds a CFS quota through a cgroup (v1 or v2) when the cgroup
  tree is writable (it is, as root, on these machines); otherwise affinity only.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000


def cpu_set(index: int, cpu: float | None) -> set[int] | None:
    """The cores the ``index``-th worker is pinned to (round robin); None without --cpu."""
    if cpu is None:
        return None
    available = sorted(os.sched_getaffinity(0))
    per_worker = max(1, min(len(available), math.ceil(cpu)))
    start = (index * per_worker) % len(available)
    return {available[(start + k) % len(available)] for k in range(per_worker)}


def thread_env(cpu: float | None) -> dict[str, str]:
    """Environment that keeps TensorFlow and BLAS within ``cpu`` cores."""
    if cpu is None:
        return {}
    n = str(max(1, math.ceil(cpu)))
    return {
        "OMP_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": n,
    }


class CpuQuota:
    """A cgroup with a CFS quota of ``cpu`` cores; a no-op where cgroups are not writable."""

    def __init__(self, name: str, cpu: float):
        self.path: Path | None = None
        quota = int(cpu * CFS_PERIOD_US)
        for base, files in (
            (Path("/sys/fs/cgroup/cpu"), {"cpu.cfs_quota_us": str(quota)}),  # cgroup v1
            (Path("/sys/fs/cgroup"), {"cpu.max": f"{quota} {CFS_PERIOD_US}"}),  # v2
        ):
            if not (base / next(iter(files))).exists() and not (base / "cgroup.procs").exists():
                continue
            path = base / "jupyter_distrain" / name
            try:
                path.mkdir(parents=True, exist_ok=True)
                for fname, value in files.items():
                    (path / fname).write_text(value)
                self.path = path
                return
            except OSError as exc:
                log.debug("no cpu quota under %s: %s", base, exc)
                self._remove(path)

    def add(self, pid: int) -> None:
        if self.path is None:
            return
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.warning("could not apply the cpu quota to pid %d: %s", pid, exc)

    def close(self) -> None:
        if self.path is not None:
            self._remove(self.path)
            self.path = None

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.rmdir()
        except OSError:
            pass
