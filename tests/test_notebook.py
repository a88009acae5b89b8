"""The quick-start notebook, executed headless exactly as `make demo` runs it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from multihost import ssh_cluster
from raycluster import QUIET_RAY

from jupyter_distrain.client.job import Job
from jupyter_distrain.contract.store import list_job_dirs

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "01-quickstart.ipynb"


def test_quickstart_notebook_trains_digits_to_90_percent(jobs_root):
    summary = _run("01-quickstart", jobs_root)[-1]  # what `make demo` prints
    rates = [float(r) for r in re.findall(r"worker \d: (\d+) images/sec", summary)]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    accuracy = float(re.search(r"validation accuracy: ([\d.]+)", summary).group(1))
    assert accuracy >= 0.90
    executed = nbformat.read(_out(jobs_root) / "01-quickstart.executed.ipynb", as_version=4)
    (view,) = _widget_outputs(executed)
    # without a kernel: the final dashboard as HTML, and the widget's own saved state
    assert "succeeded" in view.data["text/html"] and view.data["text/html"].count("exited") == 2
    states = executed.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    header = states[view.data[WIDGET_VIEW]["model_id"]]["state"]["children"][0]
    assert "succeeded" in states[header.removeprefix("IPY_MODEL_")]["state"]["value"]


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _widget_outputs(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The outputs that show a job's widget."""
    return [
        o
        for cell in notebook.cells
        for o in cell.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    ]


def _out(jobs_root: Path) -> Path:
    """The folder a test's notebooks run in and are written to."""
    out = jobs_root.with_name(f"{jobs_root.name}-notebooks")
    out.mkdir(mode=0o700, exist_ok=True)
    return out


def _run(name: str, jobs_root: Path, env: dict[str, str] | None = None) -> list[str]:
    """Execute ``notebooks/<name>.ipynb`` as `make demo` does, the executed copy and the
    kernel in a folder of the test's (the notebooks' folder may be read-only, as for a
    user of a shared install); each code cell's text (its kernel's environment: this
    one, the job store, and ``env``)."""
    notebook = NOTEBOOK.with_name(f"{name}.ipynb")
    out = _out(jobs_root)
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK.parent / "run.py"), str(notebook), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "JUPYTER_DISTRAIN_ROOT": str(jobs_root), **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # its channels on Unix sockets of its own: no kernel reachable over TCP (it said so)
    assert "Kernel is running over TCP" not in proc.stderr, proc.stderr[-3000:]
    executed = nbformat.read(out / f"{name}.executed.ipynb", as_version=4)
    return [
        "".join(o.get("text", "") for o in cell.get("outputs", []))
        for cell in executed.cells
        if cell.cell_type == "code"
    ]


def _accuracy(text: str) -> tuple[int, float]:
    match = re.search(r"^\[0\] final global_step (\d+) accuracy ([\d.]+)$", text, re.M)
    assert match, text[-2000:]
    return int(match.group(1)), float(match.group(2))


def test_parameter_servers_notebook_trains_with_the_strategy_and_both_sgd_flavours(jobs_root):
    cells = _run("02-parameter-servers", jobs_root)
    summary = cells[2]
    assert re.match(r"ParameterServerStrategy(V2)?\nvariables on the ps: True\n", summary), summary
    assert float(re.search(r"validation accuracy: ([\d.]+)", summary).group(1)) >= 0.85
    sync_step, sync_accuracy = _accuracy(cells[3])
    async_step, async_accuracy = _accuracy(cells[4])
    assert sync_step == 40 and async_step >= 40
    assert sync_accuracy >= 0.8 and async_accuracy >= 0.8


def test_seed_flow_notebook_runs_the_cml_api(jobs_root):
    cells = _run("03-seed-flow", jobs_root)
    assert "2 running, 0 failed\n" in cells[1]
    assert "stopped: ['killed', 'killed']" in cells[1]
    assert "ps: 1 workers: 2\nsession: grpc://" in cells[3]
    assert "job succeeded" in cells[3]
    assert float(re.search(r"final global_step 40 accuracy ([\d.]+)", cells[3]).group(1)) >= 0.8


@pytest.mark.horovod
def test_bench_notebook_prints_a_row_per_backend_and_worker_count(jobs_root):
    table = _run("06-bench", jobs_root)[1]
    rows = re.findall(
        r"^(horovod|tf|ps a?sync \(1 ps\))\s+TensorFlow\s+(\d)\s+([\d,]+)\s+([\d.]+)$",
        table,
        re.M,
    )
    assert sorted((b, int(n)) for b, n, _, _ in rows) == [
        ("horovod", 1),
        ("horovod", 2),
        ("ps async (1 ps)", 1),
        ("ps async (1 ps)", 2),
        ("ps sync (1 ps)", 1),
        ("ps sync (1 ps)", 2),
        ("tf", 1),
        ("tf", 2),
    ], table
    assert all(float(e) == 1.0 for _, n, _, e in rows if n == "1")
    assert all(float(r.replace(",", "")) > 0 for _, _, r, _ in rows)


@pytest.mark.horovod
def test_custom_loop_notebook_learns_with_timed_steps(jobs_root):
    cells = _run("07-custom-loop", jobs_root)
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", cells[2]).groups())
    assert last < first
    assert float(re.search(r"validation accuracy: ([\d.]+)", cells[2]).group(1)) >= 0.85
    job = Job(list_job_dirs(jobs_root)[0])
    records = [json.loads(line) for line in job.dir.metrics_file.open()]
    steps = {r["index"]: r["step"] for r in records if "step" in r}
    assert steps == {0: 150, 1: 150}  # every timed step reached the widget's metrics


@pytest.mark.horovod
def test_scaling_notebook_grows_an_elastic_job_in_place_and_a_keras_job_from_a_checkpoint(
    jobs_root,
):
    cells = _run("04-scaling", jobs_root)
    assert "scaling to 3 workers in place." in cells[2]
    assert "succeeded: 3 workers\nranks 0 and 1 kept their processes: True\n" in cells[3]
    sizes = ast.literal_eval(re.search(r"as rank 0 saw them: (\[.*\])", cells[3]).group(1))
    assert sizes[0] == [0, 2] and sizes[-1][1] == 3, sizes
    assert "scaling to 3 workers at the next checkpoint." in cells[5]
    assert "succeeded: 3 workers, generation 1\n" in cells[6]
    assert int(re.search(r"started at epoch (\d+) with 3 workers", cells[6]).group(1)) > 0
    accuracies = re.findall(r"validation accuracy: ([\d.]+)", cells[3] + cells[6])
    assert len(accuracies) == 2 and all(float(a) >= 0.85 for a in accuracies)


@pytest.mark.horovod
@pytest.mark.root  # the hosts are network namespaces
def test_multi_host_notebook_trains_on_a_local_ray_and_over_ssh_on_two_hosts(jobs_root, tmp_path):
    with ssh_cluster(tmp_path / "hosts") as hosts:
        ssh_flags = hosts.flags().removeprefix("--launcher ssh ")
        cells = _run("05-multi-host", jobs_root, env={"DISTRAIN_DEMO_SSH": ssh_flags, **QUIET_RAY})
    assert "Ray: no running cluster found; the job starts a local one" in cells[1]
    # a local Ray's rendezvous listens on loopback: nothing to warn about (it said so)
    assert "reachable by other hosts" not in cells[1]
    reach = r"reachable by other hosts: Horovod rendezvous \(unauthenticated, [\d.]+\) on port \d+"
    assert re.search(reach, cells[4]), cells[4]  # on the hosts' network
    assert re.search(r"^Ray: 2 workers on \['[^']+', '[^']+'\]$", cells[2], re.M), cells[2]
    assert "Hosts checked: " in cells[4]
    assert "ssh: 2 workers on ['jdh1', 'jdh2']\n" in cells[5]  # one rank on each host
    accuracies = re.findall(r"validation accuracy: ([\d.]+)", cells[2] + cells[5])
    assert len(accuracies) == 2 and all(float(a) >= 0.85 for a in accuracies)
