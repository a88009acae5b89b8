"""The host agent's ``unpack`` removes what jobs of this notebook that are over left on
its host, and nothing else, before it unpacks the next job's files and hands back free
ports (run as the launcher runs it, in a subprocess)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jupyter_distrain.launchers.agent.files import JOBS_ROOT, OWNER


def _host_dir(home: Path, job: str, owner: str | None, hostname: str = "") -> Path:
    directory = home / JOBS_ROOT / job / (hostname or socket.gethostname())
    directory.mkdir(mode=0o700, parents=True)
    (directory / "push.pkl").write_bytes(b"secret values")
    if owner is not None:
        (directory / OWNER).write_text(owner)
    return directory


def _empty_tar() -> bytes:
    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w").close()
    return buffer.getvalue()


def _unpack(home: Path, claims: dict[str, object] | None) -> dict[str, object]:
    """The agent's ``unpack`` of a new job (``next-000009``) on this host, with the
    sweep when ``claims`` are given."""
    target = home / JOBS_ROOT / "next-000009" / socket.gethostname()
    argv = ["unpack", str(target), "--owner", "me", "--address", "127.0.0.1", "--ports", "2"]
    data = _empty_tar()
    if claims is not None:
        argv.append("--leftovers")
        data = json.dumps(claims).encode() + b"\n" + data
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_distrain.launchers.agent", *argv],
        input=data,
        capture_output=True,
        env={**os.environ, "HOME": str(home)},
        check=True,
        timeout=60,
    )
    assert (target / OWNER).read_text() == "me"
    return json.loads(done.stdout.decode().splitlines()[-1])


def test_unpack_removes_only_this_notebooks_dead_jobs_on_its_host(tmp_path):
    dead = _host_dir(tmp_path, "dead-000001", "me")
    live = _host_dir(tmp_path, "live-000002", "me")
    others = _host_dir(tmp_path, "others-000003", "another notebook")
    unmarked = _host_dir(tmp_path, "old-000004", None)
    other_host = _host_dir(tmp_path, "dead-000001", "me", hostname="some-other-host")
    target = _host_dir(tmp_path / "elsewhere", "linked-000005", "me")
    (tmp_path / JOBS_ROOT / "linked-000005").symlink_to(target.parent)
    found = _unpack(tmp_path, {"notebook": "me", "live": ["live-000002", "next-000009"]})
    assert found["removed"] == ["dead-000001"]
    assert len(set(found["ports"])) == 2 and all(1024 <= p < 65536 for p in found["ports"])
    assert not dead.exists() and other_host.is_dir()  # a host sharing the home: its own
    assert all(d.is_dir() for d in (live, others, unmarked, target))


def test_an_unpack_without_leftovers_removes_nothing(tmp_path):
    dead = _host_dir(tmp_path, "dead-000001", "me")
    assert _unpack(tmp_path, None)["removed"] == [] and dead.is_dir()


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile-filters", "python-3.11.2"])
def test_unpack_takes_files_and_folders_and_refuses_links_whatever_the_python(
    tmp_path, monkeypatch, filters
):
    # Debian 12's Python 3.11.2 has no extractall(filter=...): every host job failed there
    from jupyter_distrain.launchers.agent.files import unpack

    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)

    def archive(*extra: tarfile.TarInfo) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in (
                ("train.py", b"print(1)\n"),
                ("checkpoints/ckpt-1/w.bin", b"\0" * 8),
            ):
                member = tarfile.TarInfo(name)
                member.size, member.mode = len(data), 0o4777
                tar.addfile(member, io.BytesIO(data))
            for member in extra:
                tar.addfile(member)
        return buffer.getvalue()

    job = tmp_path / "jobs" / "job-000001"
    unpack(job, archive())
    assert (job / "train.py").read_bytes() == b"print(1)\n"
    assert (job / "checkpoints" / "ckpt-1" / "w.bin").stat().st_size == 8
    assert (job / "train.py").stat().st_mode & 0o7022 == 0  # no set-id, no write for others
    for name, kind in (
        ("link", tarfile.SYMTYPE),
        ("../up", tarfile.REGTYPE),
        ("/abs", tarfile.REGTYPE),
    ):
        bad = tarfile.TarInfo(name)
        bad.type, bad.linkname = kind, "/etc/passwd"
        other = tmp_path / "jobs" / f"job-{kind.hex()}{len(name)}"
        with pytest.raises(tarfile.TarError):
            unpack(other, archive(bad))
        assert not (other / "link").exists() and not (tmp_path / "jobs" / "up").exists()
