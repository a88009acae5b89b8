"""GPU assignment and refusal. There is no GPU here: the device list is faked at the
launcher's boundary (``launchers.gpus.discover``), the only place a fake stands in;
the jobs, processes and CUDA_VISIBLE_DEVICES they see are real."""

from __future__ import annotations

import pytest

from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.contract.store import list_job_dirs
from jupyter_distrain.launchers import gpus

PRINT_DEVICES = "import os\nprint('devices', repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(gpus, "discover", lambda: ["0", "1", "2", "3"])


def _devices(job, role: str, index: int) -> str:
    return job.logs(ProcessId(role, index)).split("devices ")[1].strip()


def test_each_worker_gets_its_own_devices_and_the_rows_say_which(four_gpus, jobs_root):
    job = submit(JobSpec(code=PRINT_DEVICES, workers=2, backend="plain", gpus=2))
    assert job.wait(timeout=60) == "succeeded"
    assert [_devices(job, "worker", i) for i in range(2)] == ["'0,1'", "'2,3'"]
    assert [p.gpus for p in job.status().processes] == [["0", "1"], ["2", "3"]]


def test_gpu_ids_choose_the_devices_and_ps_get_none(four_gpus, jobs_root):
    spec = JobSpec(code=PRINT_DEVICES, workers=1, ps=1, gpus=1, gpu_ids=["3", "1"])
    job = submit(spec)
    wait = job.wait  # the chief prints and exits; the worker and ps only serve
    assert wait(timeout=120) == "succeeded"
    rows = {str(p.id): p.gpus for p in job.status().processes}
    assert rows == {"chief-0": ["3"], "worker-0": ["1"], "ps-0": []}
    assert _devices(job, "chief", 0) == "'3'"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"workers": 3, "gpus": 2}, "--gpus 2: 3 processes need 6 GPUs; this machine has 4"),
        ({"workers": 1, "gpus": 1, "gpu_ids": ["7"]}, "--gpu-ids: no GPU 7 on this machine"),
        ({"workers": 2, "gpus": 2, "gpu_ids": ["0", "1"]}, "--gpu-ids names 2"),
        ({"workers": 1, "gpu_ids": ["0"]}, "--gpu-ids needs --gpus"),
        ({"workers": 1, "gpus": -1}, "--gpus must be a whole number"),
    ],
)
def test_more_gpus_than_there_are_is_refused_before_anything_starts(
    four_gpus, jobs_root, fields, message
):
    with pytest.raises(SpecError, match=message):
        submit(JobSpec(code="pass\n", backend="plain", **fields))
    assert list_job_dirs(jobs_root) == []


def test_a_machine_without_gpus_refuses_gpus_and_leaves_cuda_alone(monkeypatch, jobs_root):
    monkeypatch.setattr(gpus, "discover", lambda: [])
    with pytest.raises(SpecError, match="this machine has 0"):
        submit(JobSpec(code="pass\n", backend="plain", gpus=1))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    job = submit(JobSpec(code=PRINT_DEVICES, workers=1, backend="plain"))
    assert job.wait(timeout=60) == "succeeded"
    assert _devices(job, "worker", 0) == "None" and job.status().processes[0].gpus == []
