"""The box a process runs in, as the kernel limits it: the CPUs it may use (its affinity
or cpuset, and a cgroup's CPU quota: ``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in
v1), its memory (the machine's, or a cgroup's ``memory.max`` / ``memory.limit_in_bytes``)
and the shared memory at ``/dev/shm``. A JupyterHub pod given 4 CPUs on a 64-core node
sees 64 cores in ``os.cpu_count()``; libraries that size their threads by it
oversubscribe the quota 16 times over. Every limit says where it came from, for the
refusals and ``%distributed doctor``. Standard library only: the worker reads it too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
_NO_LIMIT_V1 = 2**62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class Limit:
    """How much of something a process here has, and what says so."""

    amount: float  # CPUs, or bytes
    source: str  # "CPU affinity", "cgroup /sys/fs/cgroup/cpu/x: cpu.cfs_quota_us", ...


def cpus() -> Limit:
    """The CPUs this process may keep busy: its affinity's count, or less where a
    cgroup's quota allows less (a fractional quota rounds up: 1.5 CPUs are 2 threads'
    worth of waiting)."""
    affinity = len(os.sched_getaffinity(0))
    found = Limit(affinity, "the CPUs this process may run on (affinity, cpuset)")
    for directory, version in _cgroup_dirs("cpu"):
        quota = _cpu_quota(directory, version)
        if quota is not None and math.ceil(quota) < found.amount:
            what = "cpu.max" if version == 2 else "cpu.cfs_quota_us"
            found = Limit(math.ceil(quota), f"cgroup {directory}: {what} {quota:g} CPUs")
    return found


def memory() -> Limit:
    """The memory this process and its children may hold: the machine's, or less where
    a cgroup limits it."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    found = Limit(total, "this machine's memory")
    for directory, version in _cgroup_dirs("memory"):
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        limit = _number(directory / name)
        if limit is not None and limit < min(found.amount, _NO_LIMIT_V1):
            found = Limit(limit, f"cgroup {directory}: {name}")
    return found


def shared_memory() -> Limit:
    """The size of ``/dev/shm`` (where PyTorch's DataLoader workers pass tensors)."""
    try:
        stat = os.statvfs(SHARED_MEMORY)
    except OSError:
        return Limit(0, f"{SHARED_MEMORY} is missing")
    return Limit(stat.f_blocks * stat.f_frsize, f"the size of {SHARED_MEMORY}")


def _cgroup_dirs(controller: str) -> Iterator[tuple[Path, int]]:
    """The directories of this process's cgroup for ``controller`` and each ancestor's up
    to the hierarchy's root (a parent's limit binds its children), with the version."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        number, controllers, path = line.split(":", 2)
        version = 2 if number == "0" and controllers == "" else 1
        if version == 1 and controller not in controllers.split(","):
            continue
        mount = _mount_of(mounts, controller, version)
        if mount is None:
            continue
        point, root = mount
        relative = path[len(root) :] if path.startswith(root) and root != "/" else path
        directory = point / relative.lstrip("/")
        while True:
            yield directory, version
            if directory == point or point not in directory.parents:
                break
            directory = directory.parent


def _mount_of(mounts: list[str], controller: str, version: int) -> tuple[Path, str] | None:
    """Where the hierarchy holding ``controller`` is mounted, and the cgroup path its
    root is (a container sees its own cgroup as ``/``)."""
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, kinds = left.split(), right.split()
        if len(fields) < 5 or len(kinds) < 3:
            continue
        fstype, options = kinds[0], kinds[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (
            version == 1 and fstype == "cgroup" and controller in options
        ):
            return Path(fields[4]), fields[3]
    return None


def _cpu_quota(directory: Path, version: int) -> float | None:
    try:
        if version == 2:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = (directory / "cpu.cfs_quota_us").read_text().strip()
        period = (directory / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return None
    return None if int(quota) < 0 else int(quota) / int(period)


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
