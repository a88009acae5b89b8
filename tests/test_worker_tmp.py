"""A worker's temporary files live in its job's directory: what a stopped worker leaves
(TensorFlow's AutoGraph files, removed only at a clean exit) never piles up in ``/tmp``,
and goes with the job under the store's retention rule."""

from __future__ import annotations

import tempfile
from pathlib import Path

from jupyter_distrain import JobSpec, submit
from jupyter_distrain.contract.process import ProcessId
from jupyter_distrain.timing import poll_until

AUTOGRAPHED = """\
import tempfile, time
import tensorflow as tf

@tf.function
def step(x):
    if x > 0:  # a tensor condition: AutoGraph converts this function and writes a file
        return x * 2.0
    return x - 1.0

print("value", float(step(tf.constant(1.5))), "tmp", tempfile.gettempdir(), flush=True)
time.sleep(600)
"""

GLOB = "__autograph_generated_file*.py"


def test_a_stopped_tf_worker_leaves_its_autograph_files_in_the_job_not_in_tmp(jobs_root):
    before = set(Path(tempfile.gettempdir()).glob(GLOB))
    job = submit(JobSpec(code=AUTOGRAPHED, workers=2, backend="tf"))
    log = job.dir.log_file(ProcessId("worker", 1))
    assert poll_until(lambda: log.exists() and "value 3.0" in log.read_text(), 120, 0.2), job.logs()
    assert job.stop() == "stopped"  # SIGTERM: no atexit, so TensorFlow removes nothing
    assert set(Path(tempfile.gettempdir()).glob(GLOB)) - before == set()
    own = job.dir.path / "tmp" / "worker-1"
    assert f"tmp {own}" in log.read_text()
    assert list(own.glob(GLOB)), sorted(job.dir.path.rglob("*"))
    assert (own.stat().st_mode & 0o777) == 0o700


def test_a_tmpdir_the_job_sets_is_kept(jobs_root, tmp_path):
    code = "import os, tempfile\nprint('tmp', tempfile.gettempdir(), os.environ['TMPDIR'])\n"
    job = submit(JobSpec(code=code, workers=1, backend="plain", env={"TMPDIR": str(tmp_path)}))
    assert job.wait(timeout=60) == "succeeded"
    assert f"tmp {tmp_path} {tmp_path}" in job.logs(ProcessId("worker", 0))
