"""A supervisor on standby: ``python -m jupyter_distrain.supervisor.standby``, started by a
kernel between its jobs (``client/standby.py``) with one end of a private socket pair as
its stdin. It imports the supervisor and every launcher and backend, and what the last
job's launcher imports later (``LauncherKind.preload``: Ray), then waits. The
kernel's next job hands it the job directory, the kernel's environment and directory,
and the job's lock (a descriptor); it answers with its pid and becomes that job's
supervisor, as a cold ``python -m jupyter_distrain.supervisor`` would, less its
start-up (~0.09 s of a warm re-run's first step). It ends, unused, when the kernel closes its end.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from ..contract.store import JobDir
from ..plugins import BACKENDS, LAUNCHERS, load_plugin, plugin_names
from ..pool import wire
from ..processes import replace_environment
from . import main as supervise_main


def _preload(launcher: str) -> None:
    """Import every launcher and backend now, and what ``launcher`` (the last job's)
    imports on its way (a broken one is the job's to report)."""
    for group in (LAUNCHERS, BACKENDS):
        for name in plugin_names(group):
            try:
                plugin = load_plugin(group, name)
                if group == LAUNCHERS and name == launcher:
                    plugin.kind.preload()
            except Exception:  # noqa: BLE001 - the job that asks for it fails with the reason
                pass


def _job_request(body: Mapping[str, Any], fds: list[int]) -> tuple[str, dict[str, str], str, int]:
    """The request's job directory, environment, directory and lock; ``ValueError`` when
    it is not one."""
    job, env, cwd = body.get("job"), body.get("env"), body.get("cwd")
    if not (isinstance(job, str) and isinstance(cwd, str) and isinstance(env, dict)):
        raise ValueError("a standby request needs job, env and cwd")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("a standby request's environment maps names to strings")
    if len(fds) != 1:
        raise ValueError("a standby request carries exactly the job's lock")
    return job, env, cwd, fds[0]


def _become(job: str, env: dict[str, str], cwd: str) -> None:
    """Take the kernel's environment and directory, and the job's supervisor log as
    stdout and stderr (as the cold start's ``Popen`` gives them)."""
    replace_environment(env)
    os.chdir(cwd)
    log = os.open(JobDir(job).supervisor_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(devnull)
    os.close(log)


def main(argv: list[str] | None = None) -> int:
    """``[LAUNCHER]``: wait for one job; supervise it. Exits 0 unused when the kernel
    goes."""
    argv = argv if argv is not None else sys.argv[1:]
    _preload(argv[0] if argv else "local")
    channel = socket.socket(fileno=os.dup(0))
    try:
        body, fds = wire.receive(channel)
    except (OSError, ValueError):
        return 0
    if body is None:
        return 0
    try:
        job, env, cwd, lock = _job_request(body, fds)
    except ValueError as exc:
        wire.send(channel, {"error": str(exc)})
        return 1
    try:
        _become(job, env, cwd)
    except OSError as exc:
        wire.send(channel, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    wire.send(channel, {"ok": os.getpid()})
    channel.close()
    return supervise_main([job, "--lock-fd", str(lock)])


if __name__ == "__main__":
    sys.exit(main())
