"""GPUs for local workers: which devices this machine has, and which each process gets.

``--gpus N`` gives every worker (and the chief) N devices of its own through
``CUDA_VISIBLE_DEVICES``, in order over what NVML or ``nvidia-smi`` reports (or over
``--gpu-ids``); Horovod's ``local_rank`` pinning then sees one device per process.
Parameter servers get none. A request for more devices than there are is refused
before anything starts. :func:`discover` is the one place that asks the machine.

Design decision
---------------

- **GPUs** (`launchers/gpus.py`): at submit the local launcher asks NVML (or
  `nvidia-smi`) which devices there are, refuses a request beyond them, and
  writes the chosen devices into the resolved spec (`gpu_ids`); the
  supervisor's allocator then gives each worker and chief its own `--gpus N` of
  them in order (`CUDA_VISIBLE_DEVICES`; ps processes get an empty list, a job
  without `--gpus` leaves CUDA alone) and the rows record them. Tests fake only
  `gpus.discover()` (there is no GPU here). Not built: GPU utilisation in the
  widget.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from ..contract.launch import GpuUsage
from ..contract.process import ProcessId
from ..contract.spec import JobSpec, SpecError

NO_GPU_ROLES = frozenset({"ps"})


def discover() -> list[str]:
    """The GPU indices this machine has (NVML where nvidia-ml-py is installed, else
    nvidia-smi); none on a machine without an NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no module, no driver, no device: ask nvidia-smi
        pass
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


_nvml: Any = None  # pynvml once initialised in this process; False: not available


def usage(devices: list[str]) -> GpuUsage | None:
    """The utilisation and memory of ``devices`` (NVML indices); None without NVML."""
    global _nvml
    if not devices:
        return None
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # no module or no driver: nothing to show, and no retrying
            _nvml = False
    if not _nvml:
        return None
    try:
        handles = [_nvml.nvmlDeviceGetHandleByIndex(int(d)) for d in devices]
        rates = [_nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
        used = sum(_nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)
    except Exception:
        return None
    return GpuUsage(sum(rates) / len(rates), int(used))


def usable(spec: JobSpec, devices: list[str]) -> list[str]:
    """The devices a job may use: ``--gpu-ids`` (each must exist), else all of them."""
    if not spec.gpu_ids:
        return devices
    unknown = [d for d in spec.gpu_ids if d not in devices]
    if unknown:
        have = ", ".join(devices) or "none"
        raise SpecError(f"--gpu-ids: no GPU {', '.join(unknown)} on this machine (it has {have})")
    return list(spec.gpu_ids)


def choose(spec: JobSpec, processes: int, devices: list[str]) -> list[str]:
    """The devices the job will use (what ``--gpu-ids`` becomes once submitted); refuses a
    request the machine's GPUs cannot hold (one line naming the flag)."""
    if not spec.gpus:
        return []
    pool = usable(spec, devices)
    needing = processes - (spec.ps if spec.backend == "ps" else 0)
    wanted = spec.gpus * needing
    if wanted > len(pool):
        raise SpecError(
            f"--gpus {spec.gpus}: {needing} processes need {wanted} GPUs; "
            f"{'this machine has' if not spec.gpu_ids else '--gpu-ids names'} {len(pool)}"
        )
    return pool


class GpuAllocator:
    """Hands each process its own devices, in order; the same process id (restarted by
    an elastic driver) gets the same devices back."""

    def __init__(self, spec: JobSpec):
        self.per_process = spec.gpus
        self.free = list(spec.gpu_ids)  # chosen at submit (``choose``)
        self.given: dict[ProcessId, list[str]] = {}

    def take(self, pid: ProcessId) -> list[str] | None:
        """The devices for ``pid``; None when the job uses no GPUs (leave CUDA alone)."""
        if not self.per_process:
            return None
        if pid.role in NO_GPU_ROLES:
            return []
        if pid not in self.given:
            self.given[pid], self.free = (
                self.free[: self.per_process],
                self.free[self.per_process :],
            )
        return self.given[pid]
