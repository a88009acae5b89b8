"""The host agent's pre-flight removes what jobs of this notebook that are over left on
its host, and nothing else (run as the launcher runs it, in a subprocess)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from jupyter_distrain.launchers.agent.host import JOBS_ROOT, OWNER, PROTOCOL


def _host_dir(home: Path, job: str, owner: str | None, hostname: str = "") -> Path:
    directory = home / JOBS_ROOT / job / (hostname or socket.gethostname())
    directory.mkdir(mode=0o700, parents=True)
    (directory / "push.pkl").write_bytes(b"secret values")
    if owner is not None:
        (directory / OWNER).write_text(owner)
    return directory


def _preflight(home: Path, claims: dict[str, object]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_distrain.launchers.agent", "preflight"]
        + ["--backend", "plain", "--leftovers"],
        input=json.dumps(claims).encode(),
        capture_output=True,
        env={**os.environ, "HOME": str(home)},
        check=True,
        timeout=60,
    )
    return json.loads(done.stdout.decode().splitlines()[-1])


def test_the_preflight_removes_only_this_notebooks_dead_jobs_on_its_host(tmp_path):
    dead = _host_dir(tmp_path, "dead-000001", "me")
    live = _host_dir(tmp_path, "live-000002", "me")
    others = _host_dir(tmp_path, "others-000003", "another notebook")
    unmarked = _host_dir(tmp_path, "old-000004", None)
    other_host = _host_dir(tmp_path, "dead-000001", "me", hostname="some-other-host")
    target = _host_dir(tmp_path / "elsewhere", "linked-000005", "me")
    (tmp_path / JOBS_ROOT / "linked-000005").symlink_to(target.parent)
    found = _preflight(tmp_path, {"notebook": "me", "live": ["live-000002"]})
    assert found["protocol"] == PROTOCOL and found["removed"] == ["dead-000001"]
    assert not dead.exists() and other_host.is_dir()  # a host sharing the home: its own
    assert all(d.is_dir() for d in (live, others, unmarked, target))


def test_a_preflight_without_leftovers_removes_nothing(tmp_path):
    dead = _host_dir(tmp_path, "dead-000001", "me")
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_distrain.launchers.agent", "preflight"]
        + ["--backend", "plain"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "HOME": str(tmp_path)},
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout)["removed"] == [] and dead.is_dir()
