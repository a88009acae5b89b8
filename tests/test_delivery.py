"""What hosts send back at a job's end (launchers/agent/delivery.py): crafted archives fed
to the notebook side's delivery, each checked from outside (no file outside the job
directory, the job's own files unchanged, one warning line naming the host and the
entry), the host side's ``pack``/``send``/``remove``, and one job through the real ssh
launcher whose second host's agent answers with a crafted archive."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import fault_row

from jupyter_distrain.contract.launch import ProcessSpec, Slot
from jupyter_distrain.contract.process import Env, Mode, ProcessId
from jupyter_distrain.launchers.agent import files
from jupyter_distrain.launchers.agent.delivery import (
    Delivery,
    Limits,
    PipeStream,
    Received,
    result_slots,
)
from jupyter_distrain.launchers.remote.bring_back import Holder, bring_back

OWN = {  # the job's own files, which nothing from a host may change
    "state.json": '{"state": "running"}\n',
    "events.jsonl": '{"kind": "launch"}\n',
    "metrics.jsonl": '{"step": 1}\n',
    "logs/worker-0.log": "rank 0's own line\n",
    "spec.json": "{}\n",
}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A job directory holding the job's own files, with a sibling ``outside`` that
    nothing may reach."""
    path = tmp_path / "root" / "job-abc123"
    (path / "logs").mkdir(parents=True)
    (path / "checkpoints").mkdir()
    for name, text in OWN.items():
        (path / name).write_text(text)
    (tmp_path / "outside").mkdir()
    return path


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def archive(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def deliver(
    job: Path, data: bytes, result: bool = True, limits: Limits | None = None
) -> tuple[Received, list[str]]:
    warnings: list[str] = []
    received = Delivery(job, warnings.append, limits).receive("host h2", io.BytesIO(data), result)
    return received, warnings


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def assert_own_files_unchanged(job: Path) -> None:
    for name, text in OWN.items():
        assert (job / name).read_text() == text, name
    assert not any(p.name.startswith(".incoming") for p in job.iterdir())  # staging gone


def path_max_chain(target: str, payload: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    """CVE-2025-4517's archive: symlinks through 16 directories of 247-character names
    make a path longer than PATH_MAX, which ``os.path.realpath`` stops resolving, so
    tarfile's ``data`` filter (before Python 3.11.13) thinks ``escape`` stays inside the
    destination; the kernel follows the short names and ``escape/planted`` lands in
    ``target`` (relative to the destination's parent)."""
    long = "d" * 247
    steps = "abcdefghijklmnop"
    entries, path = [], ""
    for step in steps:
        entries.append(entry(os.path.join(path, long), kind=tarfile.DIRTYPE))
        entries.append(entry(os.path.join(path, step), kind=tarfile.SYMTYPE, link=long))
        path = os.path.join(path, long)
    top = os.path.join(*steps, "l" * 254)
    entries.append(entry(top, kind=tarfile.SYMTYPE, link="../" * len(steps)))
    entries.append(entry("escape", kind=tarfile.SYMTYPE, link=f"{top}/../{target}"))
    entries.append(entry("escape/planted", payload))
    return entries


# --- what a host legitimately sends -------------------------------------------------------
def test_the_result_and_checkpoints_a_host_packs_are_stored_private(job, tmp_path):
    produced = tmp_path / "on-host"
    (produced / "checkpoints" / "keras-backup").mkdir(parents=True)
    (produced / "result.pkl").write_bytes(pickle.dumps({"defined": True, "value": 7}))
    (produced / "checkpoints" / "keras-backup" / "chief.index").write_bytes(b"x" * 3000)
    (produced / "logs").mkdir()
    (produced / "logs" / "worker-1.log").write_text("host's log\n")  # stays on the host
    (produced / "state.json").write_text("{}")
    os.symlink("/", produced / "data")  # `ln -s /datasets data` in the working directory
    os.symlink("/etc/passwd", produced / "checkpoints" / "passwd")
    os.mkfifo(produced / "checkpoints" / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(produced / "control.sock"))
        packed = io.BytesIO()
        files.pack(produced, packed)
    sent = ["result.pkl", "checkpoints", "checkpoints/keras-backup"]
    sent.append("checkpoints/keras-backup/chief.index")
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue())) as tar:
        assert tar.getnames() == sent
    received, warnings = deliver(job, packed.getvalue())
    assert received.complete and warnings == []
    assert received.stored == sent
    assert pickle.loads((job / "result.pkl").read_bytes()) == {"defined": True, "value": 7}
    backup = job / "checkpoints" / "keras-backup"
    assert (backup / "chief.index").read_bytes() == b"x" * 3000
    assert (job / "result.pkl").stat().st_mode & 0o777 == 0o600
    assert backup.stat().st_mode & 0o777 == 0o700
    assert_own_files_unchanged(job)


def test_the_agent_sends_as_it_packs_and_removes_only_when_told(job, tmp_path):
    directory = tmp_path / "jobs" / "job-abc123" / "jdh1"
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "checkpoints" / "step").write_text("12")
    agent = [sys.executable, "-m", "jupyter_distrain.launchers.agent"]
    with subprocess.Popen([*agent, "send", str(directory)], stdout=subprocess.PIPE) as sender:
        assert sender.stdout is not None
        stream = PipeStream(sender.stdout, 30, 60, lambda: None)
        received = Delivery(job, [].append).receive("host h1", stream, True)
    assert sender.returncode == 0 and received.complete
    assert (job / "checkpoints" / "step").read_text() == "12"
    assert directory.is_dir()  # still there: the notebook side says when it may go
    subprocess.run([*agent, "remove", str(directory)], check=True)
    assert not directory.parent.exists()  # the job's, once no host directory is left


def test_rank_0_stores_the_result_wherever_its_slot_is():
    slots = [Slot("h1", "10.0.0.1", 0, 0), Slot("h2", "10.0.0.2", 1, 0)]
    worker = ProcessSpec(ProcessId("worker", 0), [], {}, slots[1], rank=0)
    assert result_slots(worker) == [slots[1]]
    assert result_slots(ProcessSpec(ProcessId("worker", 1), [], {}, slots[0], rank=1)) == []
    ps = ProcessSpec(ProcessId("ps", 0), [], {Env.MODE: Mode.TF1_RUN}, slots[0], rank=0)
    server = ProcessSpec(ProcessId("worker", 0), [], {Env.MODE: "server"}, slots[0], rank=0)
    assert result_slots(ps) == result_slots(server) == []
    members = {ProcessId("worker", s.index): s for s in reversed(slots)}
    assert result_slots(ProcessSpec(ProcessId("mpirun", 0), [], {}, hosts=members)) == [slots[0]]


# --- the one bring-back loop of ssh, Slurm and Ray ----------------------------------------
def test_each_holders_directory_is_removed_only_once_its_files_are_stored_here(job):
    """Every holder is read (one failing takes nothing from the others); a directory is
    removed only after its files came whole; where not, the warning says where they stay;
    a removal that fails is said, not taken for a lost archive."""
    removed: list[str] = []

    def holder(name: str, data: bytes | Exception, remove_fails: bool = False) -> Holder:
        def open_archive():
            if isinstance(data, Exception):
                raise data
            return contextlib.nullcontext(io.BytesIO(data))

        def remove() -> None:
            if remove_fails:
                raise RuntimeError(f"host {name}: no answer within 60 s")
            removed.append(name)

        return Holder(f"host {name}", f"/jobs/{name}", name == "h1", open_archive, remove)

    warnings: list[str] = []
    holders = [
        holder("h1", archive(entry("result.pkl", b"rank 0's"))),
        holder("h2", archive(entry("checkpoints/x", b"1"))[:700]),  # cut short
        holder("h3", ConnectionResetError("the actor died")),
        holder("h4", archive(), remove_fails=True),
    ]
    bring_back(job, holders, warnings.append)
    assert (job / "result.pkl").read_bytes() == b"rank 0's"
    assert removed == ["h1"]
    assert sorted(warnings) == [
        "host h2: what the job produced there was not brought back (its archive is "
        "unreadable: unexpected end of data); it stays there in /jobs/h2",
        "host h3: what the job produced there was not brought back (the actor died); it "
        "stays there in /jobs/h3",
        "host h4: the job's directory there is left in /jobs/h4 (it could not be removed: "
        "no answer within 60 s)",
    ]
    assert_own_files_unchanged(job)


# --- crafted archives -----------------------------------------------------------------
def test_the_path_max_symlink_chain_gets_past_tarfiles_own_filter_here(tmp_path):
    """Why the notebook side extracts nothing with tarfile: on this Python the chain
    writes outside the destination through the safest extraction tarfile offers
    (``extractall(filter="data")``, or plain ``extractall`` on a Python without filters,
    Debian 12's 3.11.2 among them)."""
    if sys.version_info >= (3, 11, 13):
        pytest.skip("this Python's tarfile has the fix for CVE-2025-4517")
    safest = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    (tmp_path / "destination").mkdir()
    (tmp_path / "outside").mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive(*path_max_chain("outside", b"pwned")))) as tar:
        tar.extractall(tmp_path / "destination", **safest)
    assert (tmp_path / "outside" / "planted").read_bytes() == b"pwned"


def test_the_path_max_symlink_chain_writes_nothing_outside(job, tmp_path):
    received, warnings = deliver(job, archive(*path_max_chain("../outside", b"pwned")))
    outside = len(files_under(tmp_path / "outside"))
    fault_row("PATH_MAX symlink chain (CVE-2025-4517)", outside == 0, "-", 0, outside)
    assert outside == 0
    assert received.complete and received.stored == []  # read to its end, nothing kept
    assert "'escape': a symbolic link" in received.refused
    assert "'escape/planted': only result.pkl and checkpoints/ come back from a host" in (
        received.refused
    )
    assert warnings[1] == "host h2: refused 'a' of what it sent back: a symbolic link"
    assert warnings[-1] == "host h2: refused 15 more entries of what it sent back"
    assert not (job / "escape").exists() and not (job / "a").exists()
    assert_own_files_unchanged(job)


@pytest.mark.parametrize(
    "name",
    ["../escaped", "checkpoints/../../escaped", "checkpoints/a/../../../outside/escaped"],
)
def test_a_dot_dot_entry_is_refused(job, tmp_path, name):
    received, warnings = deliver(job, archive(entry(name, b"x"), entry("checkpoints/ok", b"1")))
    assert warnings == [f"host h2: refused {name!r} of what it sent back: a name with '..'"]
    assert not (tmp_path / "root" / "escaped").exists()
    assert files_under(tmp_path / "outside") == set()
    assert received.complete and received.stored == ["checkpoints/ok"]  # the rest is kept
    assert_own_files_unchanged(job)


def test_an_absolute_name_is_refused(job, tmp_path):
    target = tmp_path / "outside" / "absolute"
    received, warnings = deliver(job, archive(entry(str(target), b"x")))
    assert warnings == [f"host h2: refused {str(target)!r} of what it sent back: an absolute name"]
    assert not target.exists() and received.stored == []
    assert_own_files_unchanged(job)


def test_hard_and_soft_links_are_refused_and_nothing_goes_through_them(job, tmp_path):
    outside = tmp_path / "outside" / "secret"
    outside.write_text("outside's own\n")
    received, warnings = deliver(
        job,
        archive(
            entry("checkpoints/hard", kind=tarfile.LNKTYPE, link="state.json"),
            entry("checkpoints/hard2", kind=tarfile.LNKTYPE, link=str(outside)),
            entry("checkpoints/soft", kind=tarfile.SYMTYPE, link=str(outside.parent)),
            entry("checkpoints/soft/secret", b"overwritten"),
            entry("checkpoints/hard", b"through the hard link"),
        ),
    )
    assert warnings[:3] == [
        "host h2: refused 'checkpoints/hard' of what it sent back: a hard link",
        "host h2: refused 'checkpoints/hard2' of what it sent back: a hard link",
        "host h2: refused 'checkpoints/soft' of what it sent back: a symbolic link",
    ]
    assert outside.read_text() == "outside's own\n"
    assert files_under(tmp_path / "outside") == {"secret"}
    for path in (job / "checkpoints").rglob("*"):
        assert not path.is_symlink() and path.stat().st_nlink <= 2, path
    assert (job / "checkpoints" / "hard").read_bytes() == b"through the hard link"
    assert_own_files_unchanged(job)


def test_device_nodes_and_fifos_are_refused(job):
    received, warnings = deliver(
        job,
        archive(
            entry("checkpoints/null", kind=tarfile.CHRTYPE),
            entry("checkpoints/disk", kind=tarfile.BLKTYPE),
            entry("checkpoints/pipe", kind=tarfile.FIFOTYPE),
        ),
    )
    assert [w.rsplit(": ", 1)[1] for w in warnings] == ["a device node", "a device node", "a fifo"]
    assert files_under(job / "checkpoints") == set() and received.complete


def test_an_oversized_file_is_refused_and_the_rest_kept(job):
    limits = Limits(file_bytes=1000)
    big, small = entry("checkpoints/big", b"x" * 5000), entry("checkpoints/small", b"y" * 10)
    received, warnings = deliver(job, archive(big, small), limits=limits)
    assert warnings == [
        "host h2: refused 'checkpoints/big' of what it sent back: "
        "5000 bytes, over the limit of 1000 per file"
    ]
    assert files_under(job / "checkpoints") == {"small"} and received.complete


def test_a_host_over_its_limit_gets_nothing_kept(job):
    data = archive(entry("checkpoints/a", b"1"), entry("checkpoints/b", b"z" * 50_000))
    received, warnings = deliver(job, data, limits=Limits(host_bytes=20_000))
    assert not received.complete and received.problem == "it sent more than 20000 bytes"
    assert files_under(job / "checkpoints") == set()  # all or nothing: not even 'a'
    assert_own_files_unchanged(job)


def test_a_huge_pax_header_stops_the_host_before_it_is_read(job):
    info = tarfile.TarInfo("checkpoints/x")
    info.pax_headers = {"comment": "c" * (2 << 20)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    received, _ = deliver(job, buffer.getvalue())
    assert received.problem.startswith("a header of ") and "over the limit" in received.problem


def test_forged_job_files_are_refused_and_the_jobs_own_kept(job):
    forged = [entry(name, b"forged\n") for name in OWN] + [
        entry("logs", kind=tarfile.DIRTYPE),
        entry("logs/worker-1.log", b"forged\n"),
        entry("control", b"forged\n"),
        entry("./push.pkl", b"forged\n"),
    ]
    received, warnings = deliver(job, archive(*forged))
    names = [*OWN, "logs", "logs/worker-1.log", "control", "./push.pkl"]
    assert warnings == [
        f"host h2: refused {name!r} of what it sent back: only result.pkl and checkpoints/ "
        "come back from a host"
        for name in names
    ]
    assert received.complete and received.stored == []
    assert not (job / "logs" / "worker-1.log").exists() and not (job / "control").exists()
    assert_own_files_unchanged(job)


def test_a_result_from_a_host_other_than_rank_0s_is_refused(job):
    (job / "result.pkl").write_bytes(b"rank 0's")
    evil = b"cos\nsystem\n(S'touch /tmp/pwned'\ntR."  # what unpickling would run
    received, warnings = deliver(job, archive(entry("result.pkl", evil)), result=False)
    assert warnings == [
        "host h2: refused 'result.pkl' of what it sent back: "
        "result.pkl comes only from the host of rank 0"
    ]
    assert (job / "result.pkl").read_bytes() == b"rank 0's"
    received, warnings = deliver(job, archive(entry("result.pkl", b"new")), result=True)
    assert warnings == [] and (job / "result.pkl").read_bytes() == b"new"


def test_checkpoints_come_back_from_rank_0s_host_only(job):
    """What comes back is handed to every host of the next generation and loaded there
    (with pickle, by torch.distributed.checkpoint): another host's files, a planted
    ``.metadata`` among them, are never kept, whichever host comes first."""
    delivery = Delivery(job, (warnings := []).append)
    planted = archive(
        entry("checkpoints/torch-state/.metadata", b"cos\nsystem\n(S'touch /tmp/pwned'\ntR."),
        entry("checkpoints/only", b"1"),
    )
    other = delivery.receive("host h2", io.BytesIO(planted), False)
    assert other.complete and other.stored == [] and len(other.left) == 2 and warnings == []
    one = archive(entry("checkpoints/torch-state/.metadata", b"rank 0's"))
    assert delivery.receive("host h1", io.BytesIO(one), True).complete
    assert (job / "checkpoints" / "torch-state" / ".metadata").read_bytes() == b"rank 0's"
    assert not (job / "checkpoints" / "only").exists()


def test_a_link_in_the_job_directory_is_not_followed(job, tmp_path):
    (job / "checkpoints").rmdir()
    os.symlink(tmp_path / "outside", job / "checkpoints")
    received, warnings = deliver(job, archive(entry("checkpoints/x", b"1")))
    assert warnings == [
        "host h2: refused 'checkpoints/x' of what it sent back: "
        "cannot put it in place: a parent of it is not a directory"
    ]
    assert files_under(tmp_path / "outside") == set()


def test_a_second_entry_of_one_name_and_a_file_under_a_file_are_refused(job):
    received, warnings = deliver(
        job,
        archive(
            entry("checkpoints/a", b"first"),
            entry("checkpoints/a", b"second"),
            entry("checkpoints/a/b", b"under a file"),
            entry("result.pkl", kind=tarfile.DIRTYPE),
            entry("checkpoints", b"a file"),
        ),
    )
    assert [w.split(": ", 2)[2] for w in warnings] == [
        "a second entry of that name",
        "a parent of it is not a directory",
        "result.pkl must be a file",
        "checkpoints must be a directory",
    ]
    assert (job / "checkpoints" / "a").read_bytes() == b"first"


def test_many_refused_entries_make_a_bounded_number_of_lines(job):
    data = archive(*[entry(f"junk{i}", b"") for i in range(50)])
    received, warnings = deliver(job, data)
    assert len(received.refused) == 50 and len(warnings) == 21
    assert warnings[-1] == "host h2: refused 30 more entries of what it sent back"


@pytest.mark.parametrize("data", [b"", b"not a tar at all" * 100, "truncated"])
def test_a_broken_archive_keeps_nothing_and_raises_nothing(job, data):
    if data == "truncated":
        data = archive(entry("checkpoints/a", b"1"), entry("checkpoints/b", b"2" * 4000))[:1500]
    received, warnings = deliver(job, data)
    assert not received.complete and received.problem
    assert files_under(job / "checkpoints") == set()
    assert_own_files_unchanged(job)


def test_a_silent_host_times_out_and_a_failed_sender_keeps_nothing(job):
    read, write = os.pipe()
    os.write(write, archive(entry("checkpoints/a", b"1"))[:1024])  # then nothing more
    with open(read, "rb") as pipe:
        stream = PipeStream(pipe, 0.3, 60, lambda: None)
        started = time.monotonic()
        received = Delivery(job, [].append).receive("host h2", stream, True)
    os.close(write)
    assert received.problem == "its archive is unreadable: nothing came for 0.3 s"
    assert time.monotonic() - started < 5

    def failed() -> None:
        raise RuntimeError("the agent exited with 1")

    read, write = os.pipe()
    os.write(write, archive(entry("checkpoints/a", b"1")))
    os.close(write)
    with open(read, "rb") as pipe:
        received = Delivery(job, [].append).receive(
            "host h2", PipeStream(pipe, 5, 60, failed), True
        )
    assert received.problem == "its archive is unreadable: the agent exited with 1"
    assert files_under(job / "checkpoints") == set()


@pytest.mark.root  # mounts a small file system
def test_a_full_disk_keeps_nothing_of_the_host_and_says_so(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        job = small / "job"
        (job / "checkpoints").mkdir(parents=True)
        (job / "state.json").write_text("own")
        data = archive(entry("result.pkl", b"r"), entry("checkpoints/big", b"b" * 400_000))
        received, _ = deliver(job, data)
        assert received.problem == "cannot store 'checkpoints/big' here: No space left on device"
        assert sorted(p.name for p in job.iterdir()) == ["checkpoints", "state.json"]
        assert (job / "state.json").read_text() == "own"
    finally:
        subprocess.run(["umount", str(small)], check=True)


# --- through the real ssh launcher --------------------------------------------------------
PLANTING = """\
import os
from jupyter_distrain import checkpoint_dir
rank = os.environ["JUPYTER_DISTRAIN_RANK"]
(checkpoint_dir() / f"rank{rank}.txt").write_text(rank)
if rank == "0":
    os.symlink("/", "data")  # an absolute link in the working directory (`ln -s /datasets data`)
result = f"from rank {rank}"
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    from multihost import ssh_cluster  # here: the other tests need no hosts

    with ssh_cluster(tmp_path_factory.mktemp("hosts")) as made:
        yield made


@pytest.mark.root  # the hosts are network namespaces
def test_a_host_answering_with_a_crafted_archive_changes_nothing_of_the_job(
    hosts, jobs_root, tmp_path
):
    from jobscan import left_after, processes_naming

    from jupyter_distrain.client import api
    from jupyter_distrain.contract.spec import JobSpec

    marker = tmp_path / "unpickled"
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()  # runs when unpickled
    crafted = tmp_path / "crafted.tar"
    crafted.write_bytes(
        archive(
            entry("logs/worker-0.log", b"forged by the host\n"),
            entry("state.json", b'{"state": "failed", "error": "forged"}'),
            entry("events.jsonl", b'{"kind": "forged"}\n'),
            entry("metrics.jsonl", b'{"forged": 1}\n'),
            entry("result.pkl", evil),
            entry("../escaped", b"x"),
            entry(str(outside / "absolute"), b"x"),
            entry("checkpoints/link", kind=tarfile.SYMTYPE, link=str(outside)),
            entry("checkpoints/rank1.txt", b"from the host, not rank 1"),
            *path_max_chain(f"../{os.path.relpath(outside, jobs_root)}", b"pwned"),
        )
    )
    wrapper = tmp_path / "python"  # --remote-python: the second host's agent sends `crafted`
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$(cat /proc/sys/kernel/hostname)" = jdh2 ] && { [ "$3" = send ] || [ "$3" = finish ]; }; then\n'
        f"    exec cat {crafted}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    spec = JobSpec(code=PLANTING, workers=2, backend="plain", out="answer", **hosts.options())
    job = api.submit(JobSpec(**{**spec.to_dict(), "remote_python": str(wrapper)}))
    state = job.wait(120)
    left = len(left_after(lambda: processes_naming(job.id), 15))
    planted = len(files_under(outside)) + len(list(jobs_root.iterdir())) - 1 + marker.exists()
    survived = state == "succeeded" and job.result() == "from rank 0" and left == 0
    fault_row("crafted archive from an ssh host", survived and not planted, state, left, planted)
    assert state == "succeeded", job.status().error
    assert job.result() == "from rank 0" and not marker.exists()
    assert (job.dir.path / "result.pkl").stat().st_mode & 0o777 == 0o600
    for own in (job.dir.state_file, job.dir.events_file, job.dir.metrics_file):
        assert "forged" not in (own.read_text() if own.exists() else ""), own
    assert "forged" not in job.logs(ProcessId("worker", 0))
    assert (job.dir.checkpoints_dir / "rank0.txt").read_text() == "0"
    # checkpoints come back from rank 0's host only (each host's go to every host next)
    assert not (job.dir.checkpoints_dir / "rank1.txt").exists()
    assert [p.name for p in jobs_root.iterdir()] == [job.id]  # no ../escaped
    assert files_under(outside) == set()
    warned = job.status().warnings
    for name, why in [
        ("logs/worker-0.log", "only result.pkl and checkpoints/ come back from a host"),
        ("state.json", "only result.pkl and checkpoints/ come back from a host"),
        ("result.pkl", "result.pkl comes only from the host of rank 0"),
        ("../escaped", "a name with '..'"),
        ("checkpoints/link", "a symbolic link"),
        ("a", "a symbolic link"),  # the chain's first link
    ]:
        assert f"host 10.232.0.12: refused {name!r} of what it sent back: {why}" in warned
    assert not any("10.232.0.11" in w for w in warned)  # rank 0's host: its link stayed there
    events = job.dir.events_file.read_text()
    assert "refused 'state.json' of what it sent back" in events
    assert list(Path.home().glob(f".jupyter_distrain/jobs/{job.id}*")) == []
