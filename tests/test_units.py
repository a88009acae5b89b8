"""Fast checks of the pure parts: spec validation, cell analysis, message signing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain.client.magics import DistributedMagics
from jupyter_distrain.contract.cellcheck import check_syntax, undefined_names
from jupyter_distrain.contract.process import Env, Mode
from jupyter_distrain.contract.spec import JobSpec, SpecError, parse_env_pairs, parse_names
from jupyter_distrain.contract.store import JobDir


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"workers": 0}, "--workers"),
        ({"cpu": 0}, "--cpu"),
        ({"memory": -1}, "--memory"),
        ({"grace": -1}, "--grace"),
        ({"timeout": 0}, "--timeout"),
        ({"name": "bad name!"}, "--name"),
        ({"controller": "nccl"}, "--controller"),
        ({"env": {"1BAD": "x"}}, "--env"),
        # a trailing newline is not a name ($ matches before it): "x\n" names no job
        ({"name": "x\n"}, "--name"),
        ({"env": {"A\n": "x"}}, "--env"),
        ({"push": ["x\n"]}, "valid Python variable name"),
        ({"out": "y\n"}, "valid Python variable name"),
    ],
)
def test_spec_rejects_bad_fields_naming_the_flag(fields, flag):
    with pytest.raises(SpecError, match=flag):
        JobSpec(code="pass", **fields).validate()


def test_a_worker_reads_its_mode_from_the_environment():
    assert Mode.from_env({Env.MODE: "tf1_run"}) == Mode.TF1_RUN
    assert Mode.from_env({}) == Mode.TRAIN and Mode.from_env({Env.MODE: "server"}) == "server"


def test_spec_round_trips_through_json():
    spec = JobSpec(code="print(1)", workers=3, env={"A": "1"}, push=["x"], out="y")
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_env_and_names_parsing():
    assert parse_env_pairs(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(SpecError, match="--env"):
        parse_env_pairs(["NOEQUALS"])
    assert parse_names("a, b c") == ["a", "b", "c"]


def test_syntax_error_names_the_cell_line():
    with pytest.raises(SpecError, match=r"line 4 \(train.py line 3\)"):
        check_syntax("a = 1\nb = 2\nc = (\n")


def test_undefined_names_ignore_everything_the_cell_binds():
    code = (
        "import numpy as np\nfrom os import path\n"
        "def f(a, *args, k=1, **kw):\n    return a + k + outer\n"
        "class C: pass\n"
        "for i in range(3):\n    total = i\n"
        "try:\n    pass\nexcept ValueError as err:\n    print(err)\n"
        "print(np, path, C, total, data, [j for j in data], model)\n"
        "result = 1\n"
    )
    assert undefined_names(code) == ["data", "model", "outer"]
    assert undefined_names("from x import *\nprint(anything)") == []


def test_help_lists_every_flag():
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("jupyter_distrain")
    doc = shell.find_cell_magic("distributed").__doc__
    for flag in (
        "--workers",
        "--backend",
        "--launcher",
        "--controller",
        "--cpu",
        "--memory",
        "--env",
        "--name",
        "--timeout",
        "--grace",
        "--push",
        "--out",
        "--background",
    ):
        assert flag in doc


def test_job_directory_is_created_private(jobs_root):
    job = JobDir.create(JobSpec(code="x = 1\n", name="unit"))
    assert job.path.parent == jobs_root and job.id.startswith("unit-")
    assert job.path.stat().st_mode & 0o777 == 0o700
    assert job.train_file.read_text() == "x = 1\n"
    assert job.read_state().state == "pending"
    assert {p.name for p in job.path.iterdir()} >= {
        "spec.json",
        "train.py",
        "state.json",
        "logs",
        "checkpoints",
    }


SHOW_RUNTIME_DIR = """\
import os
from jupyter_distrain.contract.private import runtime_dir
first, again = runtime_dir(), runtime_dir()
(first / "control.sock").touch()
info = first.lstat()
print(first, again, oct(info.st_mode & 0o777), info.st_uid == os.getuid())
"""


@pytest.mark.root  # mounts a tmpfs on /tmp in a mount namespace
@pytest.mark.parametrize(
    "made_first", ["mkdir -m 700 {d} && chown 65534 {d}", "mkdir -m 755 {d}", "ln -s /var {d}"]
)
def test_a_runtime_directory_another_user_made_first_is_passed_over(made_first):
    """Without XDG_RUNTIME_DIR, /tmp/jupyter-distrain-<uid> may be another user's (or
    open to others): a fresh private directory is used instead of refusing every job."""
    shared = f"/tmp/jupyter-distrain-{os.getuid()}"
    script = (  # a /tmp of its own: the real one stays as it is
        f"mount -t tmpfs tmpfs /tmp && {made_first.format(d=shared)} && "
        f"{sys.executable} -c '{SHOW_RUNTIME_DIR}' && ls -A {shared}/"
    )
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    first, again, mode, mine, *listed = done.stdout.split()
    assert first == again and first.startswith("/tmp/") and first != shared
    assert (mode, mine) == ("0o700", "True")
    assert "control.sock" not in listed  # nothing went into the other user's directory


def test_a_local_rays_sockets_fit_under_systemds_runtime_directory(monkeypatch):
    """With XDG_RUNTIME_DIR as long as systemd's (``/run/user/UID``), Ray's deepest
    socket under a local Ray's root must stay within a Unix socket path's 107 bytes (it
    came to 116: every local Ray job of such a user failed to start)."""
    from jupyter_distrain.launchers.ray.launcher import local_ray_root

    runtime = tempfile.mkdtemp(prefix="jdr", dir="/tmp")  # 16 characters, 0700
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
        root = local_ray_root()
        deepest = root / "session_2026-12-07_19-35-17_920887_4194304/sockets/plasma_store"
        assert len(str(deepest)) <= 107, deepest
        assert stat.S_IMODE(root.parent.stat().st_mode) == 0o700
        root.parent.rmdir()
    finally:
        shutil.rmtree(runtime)


def test_plugins_are_read_once_and_a_plugin_installed_since_is_found(monkeypatch):
    from importlib.metadata import EntryPoint

    from jupyter_distrain import plugins

    group = "jupyter_distrain.test_plugins"
    installed = [EntryPoint("one", "json:JSONDecoder", group)]
    reads = []

    def entry_points(group: str) -> list[EntryPoint]:
        reads.append(group)
        return [ep for ep in installed if ep.group == group]

    monkeypatch.setattr(plugins, "entry_points", entry_points)
    plugins._registered.cache_clear()
    try:
        assert plugins.load_plugin(group, "one") is json.JSONDecoder
        assert plugins.load_plugin(group, "one") is json.JSONDecoder
        assert reads == [group]  # each installed distribution's metadata read once
        installed.append(EntryPoint("two", "json:JSONEncoder", group))  # pip install meanwhile
        assert plugins.load_plugin(group, "two") is json.JSONEncoder
        with pytest.raises(ValueError, match="unknown test_plugin 'three'; available: one, two"):
            plugins.load_plugin(group, "three")
    finally:
        plugins._registered.cache_clear()


def test_no_module_answers_to_a_name_no_release_shipped():
    # the version is 0.1.0 and nothing was released: moved modules keep no old name
    program = (
        "import importlib\n"
        "for name in ('store', 'job', 'remote', 'launchers.hosts'):\n"
        "    try:\n"
        "        importlib.import_module('jupyter_distrain.' + name)\n"
        "        print('found', name)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "contract = importlib.import_module('jupyter_distrain.contract')\n"
        "print(hasattr(contract, 'Env'), 'done')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "done"], done.stdout + done.stderr


def test_the_cell_magics_flags_given_to_the_line_magic_say_what_to_type(jobs_root):
    """``%distributed --workers 2`` (one %, a common slip) names the cell magic; nothing
    is launched."""
    magics = DistributedMagics(InteractiveShell.instance())
    with pytest.raises(UsageError) as said:
        magics.distributed("--workers 2 --backend torch")
    assert "make `%%distributed --workers 2 --backend torch` its first line" in str(said.value)
    assert "invalid choice" not in str(said.value)
    assert list(jobs_root.iterdir()) == []


def test_a_dump_of_every_thread_reads_as_named_stacks_without_the_bootstrap(tmp_path):
    """faulthandler's text (``worker/stacks.py`` reads it): threads named as ``threading``
    names them, the main one marked, outermost frame first, the program's own files
    relative to the job and marked, libraries relative to site-packages, the bootstrap's
    frames (runpy, jupyter_distrain/worker) left out."""
    import threading

    from jupyter_distrain.worker.stacks import parse_dump

    program = tmp_path / "train.py"
    program.write_text("import time\n\ndef load_batch():\n    time.sleep(300)\n")
    main = threading.main_thread().ident
    dump = (
        "Thread 0x00000000000000ff (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        f"Current thread 0x{main:016x} (most recent call first):\n"
        f'  File "{program}", line 4 in load_batch\n'
        f'  File "/x/lib/python3.11/site-packages/torch/nn/module.py", line 7 in forward\n'
        f'  File "{program}", line 9 in <module>\n'
        '  File "/opt/env/jupyter_distrain/worker/__main__.py", line 151 in run_program\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    other, mine = parse_dump(dump, [str(tmp_path)])
    assert (other.name, other.main, [f.where() for f in other.frames]) == (
        "thread 0x00000000000000ff",
        False,
        ["threading.py:320"],
    )
    assert mine.name == "MainThread" and mine.main
    assert [(f.where(), f.function, f.own) for f in mine.frames] == [
        ("train.py:9", "<module>", True),
        ("torch/nn/module.py:7", "forward", False),
        ("train.py:4", "load_batch", True),
    ]
    assert mine.frames[-1].code == "time.sleep(300)"
    assert mine.summary() == "train.py:4 in load_batch  time.sleep(300)"


def test_a_process_s_stacks_fit_a_control_request_keeping_its_main_thread():
    from jupyter_distrain.contract.stacks import Frame, ProcessStacks, ThreadStack

    frames = [Frame(f"lib/module_{i}.py", i, "f" * 100, "x" * 150) for i in range(40)]
    threads = [ThreadStack(f"t{i}", frames) for i in range(30)]
    stacks = ProcessStacks("worker-0", threads=[*threads, ThreadStack("MainThread", frames, True)])
    assert len(json.dumps(stacks.to_dict())) > 60_000
    fitted = ProcessStacks.from_dict(stacks.fitted(60_000))
    assert len(json.dumps(fitted.to_dict())) <= 60_000
    main = fitted.main_thread()
    assert main is not None and main.frames[-1] == frames[-1]


TREE = """\
import subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", "b = bytearray(40 << 20); import time; time.sleep(60)"]) for _ in range(2)]
print("up", flush=True)
time.sleep(60)
"""


def test_sampling_the_memory_of_many_trees_scans_the_process_table_once(monkeypatch):
    """tree_rss counts every descendant (two children holding 40 MiB each) and the trees
    of a whole sampling tick share one scan of the process table: psutil's children()
    scanned it for every process sampled (quadratic in a job's ranks)."""
    import psutil

    from jupyter_distrain import processes

    parents = [
        subprocess.Popen(
            [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        for _ in range(3)
    ]
    try:
        for parent in parents:
            assert parent.stdout.readline() == "up\n"
        time.sleep(processes.PARENT_MAP_SECONDS)  # a scan made before the children is old
        scans = []
        real_iter = psutil.process_iter
        monkeypatch.setattr(
            psutil, "process_iter", lambda *a, **k: scans.append(1) or real_iter(*a, **k)
        )
        sizes = [processes.tree_rss(parent.pid) for parent in parents]
        assert len(scans) == 1
        assert all(size > 80 << 20 for size in sizes), sizes
    finally:
        for parent in parents:
            processes.signal_tree(psutil.Process(parent.pid), signal.SIGKILL)
            parent.wait()
