"""Settings in Jupyter's config files (``jupyter_distrain_config.py``/``.json`` in
Jupyter's config directories): a flag's default and an
environment setting set there, in the order flag > environment > file > default,
shown by ``jupyter-distrain config`` with where each came from; a bad value or an
unknown name is one line naming the file and the key, and nothing is launched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain.client import api, config
from jupyter_distrain.client.magics import DistributedMagics, checked_spec
from jupyter_distrain.contract.store import list_job_dirs

CLI = str(Path(sys.executable).with_name("jupyter-distrain"))


@pytest.fixture
def config_dirs(tmp_path, monkeypatch):
    """The user's config directory and an extra one (``$JUPYTER_CONFIG_PATH``, which
    Jupyter ranks above the user's), both empty."""
    user, extra = tmp_path / "user", tmp_path / "extra"
    user.mkdir()
    extra.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(user))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(extra))
    for name in ("JUPYTER_DISTRAIN_POOL_SIZE", "JUPYTER_DISTRAIN_KEEP_DAYS"):
        monkeypatch.delenv(name, raising=False)
    return user, extra


def cli_config(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def rows(text: str) -> dict[str, tuple[str, str]]:
    """``config``'s table: name -> (value, source)."""
    table = {}
    for line in text.splitlines():
        name, value, source = line.split(maxsplit=2)
        table[name] = (value, source)
    return table


def test_the_config_files_set_defaults_and_the_environment_overrides_them(config_dirs):
    user, extra = config_dirs
    (user / "jupyter_distrain_config.json").write_text(
        json.dumps({"Distrain": {"stall_timeout": 300.0, "pool_size": 2, "keep_days": 7.0}})
    )
    (user / "jupyter_distrain_config.py").write_text("c.Distrain.pool_size = 3\n")  # over .json
    (extra / "jupyter_distrain_config.py").write_text("c.Distrain.grace = 2.0\n")
    shown = rows(cli_config({"JUPYTER_DISTRAIN_KEEP_DAYS": "9"}).stdout)
    assert shown["stall_timeout"] == ("300.0", f"config file {user}/jupyter_distrain_config.json")
    assert shown["pool_size"] == ("3", f"config file {user}/jupyter_distrain_config.py")
    assert shown["grace"] == ("2.0", f"config file {extra}/jupyter_distrain_config.py")
    assert shown["keep_days"] == ("'9'", "$JUPYTER_DISTRAIN_KEEP_DAYS")
    assert shown["hang_timeout"] == ("120.0", "default")
    environ: dict[str, str] = {}
    config.apply(environ)  # what the magic, the server and submit() do
    assert environ == {"JUPYTER_DISTRAIN_POOL_SIZE": "3", "JUPYTER_DISTRAIN_KEEP_DAYS": "7.0"}
    (user / "jupyter_distrain_config.py").write_text("c.Distrain.pool_size = 4\n")
    config.apply(environ)  # the next cell: the files as they are now
    assert environ == {"JUPYTER_DISTRAIN_POOL_SIZE": "4", "JUPYTER_DISTRAIN_KEEP_DAYS": "7.0"}
    (user / "jupyter_distrain_config.json").unlink()
    environ["JUPYTER_DISTRAIN_POOL_SIZE"] = "6"  # the user's own: kept
    config.apply(environ)
    assert environ == {"JUPYTER_DISTRAIN_POOL_SIZE": "6"}


def test_a_cell_takes_the_files_defaults_and_its_flags_win(config_dirs, monkeypatch):
    user, _ = config_dirs
    (user / "jupyter_distrain_config.py").write_text(
        "c.Distrain.stall_timeout = 300.0\nc.Distrain.grace = 2.0\n"
    )
    submitted = []
    monkeypatch.setattr(
        api, "submit", lambda checked, ns=None: submitted.append(checked.spec) or 1 / 0
    )
    magics = DistributedMagics(InteractiveShell.instance())
    for line in ("--workers 2", "--workers 2 --stall-timeout 10"):
        with pytest.raises(ZeroDivisionError):
            magics._start(checked_spec(line, "pass\n")[0])
    assert [(s.stall_timeout, s.grace) for s in submitted] == [(300.0, 2.0), (10.0, 2.0)]
    (user / "jupyter_distrain_config.py").unlink()  # the next cell has the defaults again
    with pytest.raises(ZeroDivisionError):
        magics._start(checked_spec("--workers 2", "pass\n")[0])
    assert submitted[-1].stall_timeout == 60.0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('c.Distrain.stall_timeout = "soon"\n', "Distrain.stall_timeout: "),
        ("c.Distrain.stall_timeot = 5.0\n", "Distrain.stall_timeot is not a setting"),
        ("c.Distrain.pool_size = \n", "cannot be read"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it_and_nothing_is_launched(
    config_dirs, jobs_root, text, said
):
    user, _ = config_dirs
    path = user / "jupyter_distrain_config.py"
    path.write_text(text)
    done = cli_config()
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"jupyter-distrain: {path}: ") and said in done.stderr
    magics = DistributedMagics(InteractiveShell.instance())
    with pytest.raises(UsageError, match=said):
        magics._start(checked_spec("--workers 2", "pass\n")[0])
    assert list_job_dirs(jobs_root) == []


def test_bench_takes_its_launcher_flags_defaults_from_the_files_as_a_cell_does(
    config_dirs, jobs_root
):
    """``jupyter-distrain bench`` and ``%distributed bench`` run on the launcher and hosts
    the files set (here hosts the ssh launcher refuses at once, naming them), and a flag
    still wins."""
    user, _ = config_dirs
    (user / "jupyter_distrain_config.py").write_text(
        'c.Distrain.launcher = "ssh"\nc.Distrain.hosts = "nohost-a:0"\n'
    )
    bench = [CLI, "bench", "--workers", "1", "--backends", "tf", "--steps", "1", "--epochs", "2"]
    for flags, host in (["--timeout", "10"], "nohost-a"), (["--hosts", "nohost-b:0"], "nohost-b"):
        done = subprocess.run(bench + flags, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.startswith(f"jupyter-distrain bench: --hosts: '{host}:0': ")
    magics = DistributedMagics(InteractiveShell.instance())
    with pytest.raises(UsageError, match="--hosts: 'nohost-a:0': "):
        magics._line_command("bench --workers 1 --backends tf --steps 1 --epochs 2")
    assert list_job_dirs(jobs_root) == []
