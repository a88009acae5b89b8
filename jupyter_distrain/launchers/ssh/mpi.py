"""Horovod over MPI across ssh hosts: mpirun runs here and starts OpenMPI's daemons
over the same ssh options; its ``--tag-output`` stream is split back into each rank's
log. The ranks' job directory is a template each host completes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

from ...contract.launch import LaunchedProcess, ProcessSpec
from ...contract.process import HOST_PLACEHOLDER, Env, ProcessId
from ...contract.store import JobDir
from ...processes import die_with_parent
from ..base import Launcher
from ..handles import LocalProcess
from ..limits import thread_env
from .connection import SshOptions
from .preflight import REMOTE_ROOT, RemoteHost

_TAG_RE = re.compile(rb"\[\d+,(\d+)\]<std(?:out|err)>:")  # mpirun --tag-output


def job_directory_template(job_id: str) -> str:
    """:meth:`RemoteHost.directory` as every host completes it (for mpirun's ranks)."""
    return f"~/{REMOTE_ROOT}/{job_id}/{HOST_PLACEHOLDER}"


def start_mpirun(
    launcher: Launcher,
    options: SshOptions,
    hosts: list[RemoteHost],
    proc: ProcessSpec,
    argv: list[str],
    log_path: Path,
) -> LaunchedProcess:
    """mpirun here (``argv``, the hosts' interpreter in it); it starts OpenMPI's daemon
    on each host over ssh (the same options: port, key, known hosts), which starts the
    ranks. Every rank gets the same environment, so the job directory is a template
    each host completes."""
    template = job_directory_template(launcher.job.id)
    env = {**os.environ, **thread_env(launcher.spec.cpu), **launcher.spec.env, **proc.env}
    env[Env.JOB_DIR] = template
    env[Env.CONTROL] = f"unix:{template}/control.sock"
    env[Env.METRICS] = f"ipc://{template}/metrics.sock"
    env[Env.RANK_OUTPUT] = "mpirun"
    networks = ",".join(sorted({h.network for h in hosts}))
    argv = list(argv)
    argv[1:1] = [
        *("--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_no_tree_spawn", "1"),
        *("--mca", "plm_rsh_args", shlex.join(options.rsh_options())),
        *("--mca", "oob_tcp_if_include", networks),
        *("--mca", "btl_tcp_if_include", networks),
        *("-x", Env.RANK_OUTPUT, "--tag-output"),
    ]
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    sorter = threading.Thread(target=sort_output, args=(launcher.job, popen, log_path), daemon=True)
    sorter.start()
    return LocalProcess(popen)


def sort_output(job: JobDir, popen: subprocess.Popen[bytes], log_path: Path) -> None:
    """Each rank's output (mpirun tags every chunk a rank writes, several chunks may
    share a line) into that rank's log; the rest into mpirun's own."""
    assert popen.stdout is not None
    logs: dict[Path, Any] = {}

    def write(path: Path, data: bytes) -> None:
        if path not in logs:
            logs[path] = open(path, "ab", buffering=0)  # noqa: SIM115
        logs[path].write(data)

    try:
        for line in popen.stdout:
            untagged, *tagged = _TAG_RE.split(line)
            if untagged:
                write(log_path, untagged)
            for rank, chunk in zip(tagged[::2], tagged[1::2], strict=True):
                write(job.log_file(ProcessId("worker", int(rank))), chunk)
    finally:
        for file in logs.values():
            file.close()
