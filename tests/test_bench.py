"""``bench``: real jobs for 1..N workers per backend, a table with scaling efficiency,
CSV/JSON/SVG saved in the job store; bad settings refused before anything runs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from multihost import ssh_cluster
from raycluster import QUIET_RAY

from jupyter_distrain.client import bench
from jupyter_distrain.client.bench.settings import program_text
from jupyter_distrain.client.job import Job
from jupyter_distrain.client.magics import DistributedMagics
from jupyter_distrain.contract.spec import SpecError
from jupyter_distrain.contract.store import list_job_dirs

TINY = {"image_size": 8, "width": 4, "blocks": 1, "batch_size": 8, "steps": 5, "epochs": 2}
TINY_FLAGS = [f"--{name.replace('_', '-')}={value}" for name, value in TINY.items()]
CLI = str(Path(sys.executable).with_name("jupyter-distrain"))


def test_a_two_worker_bench_of_tf_and_ps_measures_every_configuration(jobs_root):
    lines: list[str] = []
    settings = bench.BenchSettings(workers=2, backends=["tf", "ps"], ps=[1], **TINY)
    rows, out = bench.run(settings, progress=lines.append)
    got = {(r.backend, r.workers): r for r in rows}
    assert set(got) == {("tf", 1), ("tf", 2), ("ps async (1 ps)", 1), ("ps async (1 ps)", 2)}
    assert all(r.images_per_sec > 0 for r in rows)
    assert got[("tf", 1)].efficiency == 1.0
    expected = got[("tf", 2)].images_per_sec / (2 * got[("tf", 1)].images_per_sec)
    assert got[("tf", 2)].efficiency == pytest.approx(expected)
    assert len(list_job_dirs(jobs_root)) == 4  # each run is a job of its own
    assert lines[0] == "bench 1/4: tf, 1 worker(s) ..." and "images/sec" in lines[-1]
    # saved beside the jobs: CSV, JSON (with the settings), the chart
    assert out.parent == jobs_root / "bench"
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert json.loads((out / "results.json").read_text())["settings"]["workers"] == 2
    svg = ET.fromstring((out / "chart.svg").read_text())
    assert len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 2
    table = bench.table(rows).splitlines()
    assert table[0].split() == ["backend", "framework", "workers", "images/sec", "efficiency"]
    assert [line.split()[0] for line in table[1:]] == ["ps", "ps", "tf", "tf"]


def test_synchronous_parameter_servers_are_benched_with_the_seeds_program(jobs_root):
    # two ps (the bench notebook's test has one)
    settings = bench.BenchSettings(workers=2, backends=["ps-sync"], ps=[2], **TINY)
    rows, _ = bench.run(settings, progress=lambda line: None)
    assert sorted((r.backend, r.workers) for r in rows) == [
        ("ps sync (2 ps)", 1),
        ("ps sync (2 ps)", 2),
    ]
    assert all(r.images_per_sec > 0 for r in rows)
    for row in rows:
        job = Job.attach(row.job)
        status = job.status()
        roles = sorted(p.role for p in status.processes)
        assert roles == ["ps"] * int(row.backend[9]) + ["worker"] * row.workers  # no chief
        # the seed's contract, synchronously: TF1's SyncReplicasOptimizer in `run`
        assert status.backend_info["tf1_run"] and "SyncReplicasOptimizer" in job.spec.code


def test_the_sync_ps_rate_is_timed_across_a_jump_in_the_global_step():
    # any worker's gradient counts towards a global step, so the chief can read 4 then 10
    # (the end): timed from its first read past the warm-up, it had measured 0 images/sec
    program = {"STEPS": 5}
    exec(program_text("ps_sync.py"), program)
    rate = program["images_per_sec"]
    assert rate([(2, 0.0), (4, 1.0), (10, 2.5)], images_per_step=16) == 16 * 6 / 1.5
    assert rate([(2, 0.0), (6, 1.0), (8, 2.0), (10, 3.0)], images_per_step=16) == 16 * 4 / 2
    assert rate([(10, 1.0)], images_per_step=16) is None  # no rate rather than a wrong one


@pytest.mark.horovod
def test_the_command_line_benches_horovod_and_copies_the_results(jobs_root, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [CLI, "bench", "--workers", "2", "--backends", "horovod", *TINY_FLAGS, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("horovod ")]
    assert [row[1:3] for row in rows] == [["TensorFlow", "1"], ["TensorFlow", "2"]]
    assert rows[0][4] == "1.00"
    assert {p.name for p in out.iterdir()} == {"results.csv", "results.json", "chart.svg"}


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--backends", "horovod,nope"],
            "--backends: nope; choose from horovod, tf, ps, ps-sync, torch",
        ),
        (["--ps", "0"], "--ps needs counts >= 1"),
        (["--ps", "two"], "--ps must be comma-separated whole numbers"),
        (["--epochs", "1"], "--epochs must be >= 2"),
        (["--workers", "0"], "--workers must be >= 1"),
        # the launcher's flags reach its pre-flight, which refuses before the first run
        (
            ["--workers", "1", "--backends", "tf", "--launcher", "ssh"],
            "--launcher ssh needs --hosts",
        ),
        (
            [
                "--workers",
                "1",
                "--backends",
                "tf",
                "--launcher",
                "ssh",
                "--hosts",
                "nohost.invalid",
            ],
            "--hosts: host nohost.invalid: Could not resolve hostname",
        ),
    ],
)
def test_bad_bench_settings_are_refused_before_anything_runs(jobs_root, flags, message):
    done = subprocess.run([CLI, "bench", *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith(f"jupyter-distrain bench: {message}")
    magics = DistributedMagics(shell=InteractiveShell.instance())
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        magics._line_command("bench " + " ".join(flags))
    assert list_job_dirs(jobs_root) == []
    with pytest.raises(SpecError):
        bench.BenchSettings(backends=[]).validate()


def test_a_run_past_its_timeout_is_stopped_and_said_in_one_line(jobs_root):
    """A run still going after ``--timeout`` seconds (TensorFlow alone takes longer to
    import than 2 s) is stopped, and the bench ends with one line and status 1, not a
    traceback with its job left running."""
    flags = ["--workers", "1", "--backends", "tf", "--timeout", "2", *TINY_FLAGS]
    done = subprocess.run([CLI, "bench", *flags], capture_output=True, text=True, timeout=120)
    job = Job(list_job_dirs(jobs_root)[0])
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"jupyter-distrain bench: bench run tf x1 ({job.id}) still running after 2 s "
        "(--timeout): stopped\n"
    )
    assert job.state == "stopped"


@pytest.mark.horovod
@pytest.mark.root  # the hosts are network namespaces
def test_bench_runs_over_ssh_on_the_hosts_and_on_a_local_ray(jobs_root, tmp_path, monkeypatch):
    for key, value in QUIET_RAY.items():
        monkeypatch.setenv(key, value)
    with ssh_cluster(tmp_path / "hosts") as hosts:
        ssh = {k: v for k, v in hosts.options().items() if k != "launcher"}
        over_ssh = bench.BenchSettings(
            workers=2, backends=["horovod"], launcher="ssh", launcher_options=ssh, **TINY
        )
        ssh_rows, _ = bench.run(over_ssh, progress=lambda line: None)
    # one worker on Ray: the launcher option reaching the jobs is what is checked here (a
    # local Ray of its own for each run; the Ray launcher has its own tests)
    on_ray = bench.BenchSettings(workers=1, backends=["horovod"], launcher="ray", **TINY)
    ray_rows, out = bench.run(on_ray, progress=lambda line: None)
    for rows, launcher, counts in ((ssh_rows, "ssh", [1, 2]), (ray_rows, "ray", [1])):
        assert sorted(r.workers for r in rows) == counts and all(r.images_per_sec > 0 for r in rows)
        for row in rows:
            job = Job.attach(row.job)
            assert job.spec.launcher == launcher
            assert len(job.status().processes) == row.workers
    two = Job.attach(next(r.job for r in ssh_rows if r.workers == 2)).status().processes
    assert sorted(p.host for p in two) == ["jdh1", "jdh2"]  # one rank on each host
    assert json.loads((out / "results.json").read_text())["settings"]["launcher"] == "ray"
