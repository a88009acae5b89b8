"""The box a job runs in, read from the kernel's own limits: real cgroups (made here as
root, v1 or v2 as the machine has them) with a CPU quota and a memory limit, and the
ordinary account submitting inside them, as a JupyterHub pod's user does."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from useraccounts import ALICE, as_user

pytestmark = pytest.mark.root  # makes cgroups

CGROUPS = Path("/sys/fs/cgroup")
PERIOD = 100_000

SUBMITTED = """\
import json, os, subprocess, sys, tempfile
from jupyter_distrain import JobSpec, SpecError, submit
from jupyter_distrain.contract import box
root = tempfile.mkdtemp()
os.environ["JUPYTER_DISTRAIN_ROOT"] = root
said = {"cpus": vars(box.cpus()), "memory": vars(box.memory())}
try:
    submit(JobSpec(code="print(1)", workers=2, memory=1, backend="plain"))
    said["refused"] = ""
except SpecError as exc:
    said["refused"] = str(exc)
said["jobs"] = os.listdir(root)
doctor = [sys.executable, "-m", "jupyter_distrain.cli", "doctor"]
said["doctor"] = subprocess.run(doctor, capture_output=True, text=True).stdout
print(json.dumps(said))
"""


@contextlib.contextmanager
def limited(cpu: float, memory: int) -> Iterator[list[Path]]:
    """A cgroup with a CPU quota of ``cpu`` CPUs and ``memory`` bytes; its directories
    (one per controller in v1)."""
    name = f"jd-box-{os.getpid()}"
    if (CGROUPS / "cgroup.controllers").exists():  # v2 alone
        made = [CGROUPS / name]
        made[0].mkdir()
        (made[0] / "cpu.max").write_text(f"{int(cpu * PERIOD)} {PERIOD}")
        (made[0] / "memory.max").write_text(str(memory))
    else:
        made = [CGROUPS / "cpu" / name, CGROUPS / "memory" / name]
        for directory in made:
            directory.mkdir()
        (made[0] / "cpu.cfs_quota_us").write_text(str(int(cpu * PERIOD)))
        (made[1] / "memory.limit_in_bytes").write_text(str(memory))
    try:
        yield made
    finally:
        for directory in made:
            directory.rmdir()  # every process in it has ended


def run_inside(made: list[Path], argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` started inside the cgroups ``made`` (its shell joins them, then execs)."""
    join = " && ".join(f"echo $$ > {d}/cgroup.procs" for d in made)
    return subprocess.run(
        ["sh", "-c", f'{join} && exec "$@"', "sh", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_job_inside_a_cgroup_is_sized_and_refused_by_its_limits_not_the_machines():
    with limited(cpu=0.5, memory=512 * 2**20) as made:
        done = run_inside(made, as_user(ALICE, [sys.executable, "-c", SUBMITTED]))
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["cpus"]["amount"] == 1 < len(os.sched_getaffinity(0))  # half a CPU: 1 thread
    assert str(made[0]) in said["cpus"]["source"]
    assert said["memory"]["amount"] == 512 * 2**20
    # one line naming the limit and where it came from; nothing launched
    assert said["refused"] == (
        "--memory 1: 2 processes need 2 GiB; this machine gives 0.5 GiB "
        f"(cgroup {made[-1]}: {'memory.max' if len(made) == 1 else 'memory.limit_in_bytes'})"
    )
    assert said["jobs"] == []
    doctor = said["doctor"]
    assert f"CPUs: 1 (cgroup {made[0]}:" in doctor
    assert f"the machine shows {os.cpu_count()}" in doctor
    assert "memory: 0.5 GiB (cgroup" in doctor
