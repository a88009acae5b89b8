"""The job commands, one engine for the ``%distributed`` line magic and ``jupyter-distrain``:
``list``, ``status JOB``, ``logs JOB [--rank N] [--follow]``, ``stacks JOB [--native]``,
``stop JOB``, ``scale JOB N``, ``attach JOB``, ``pool [--clear]``, ``clean``.

:func:`add_commands` defines their arguments on either front end's parser, and
:func:`run` carries one out and prints what both print. A refusal (no such job, a
value out of range, a scale the job cannot take) is :class:`CommandError`, one line:
the magic shows it as a usage error, the command line prints it and exits with
:data:`EXIT_USAGE`. :func:`run` returns the exit status a script can use:
:data:`EXIT_OK`, or :data:`EXIT_FAILED` when the job shown failed.

Design decision
---------------

- **`%distributed attach`**: an interrupt while attached detaches (the job goes
  on) rather than stopping it; only the cell that started a job stops it on
  interrupt. `%distributed stop` stops explicitly.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from ..contract.process import ProcessId
from ..contract.stacks import StacksReport
from ..contract.status import JobStatus
from . import config, retention
from . import session as sessions
from .follow import follow
from .job import Job, JobFailed

EXIT_OK = 0
EXIT_FAILED = 1  # the job shown failed
EXIT_USAGE = 2  # bad arguments, no such job, a refused command
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT

ATTACH_LINES = 10  # each log's last lines `attach` shows first, as `tail -f` does
JOB_COMMANDS = ("status", "logs", "stacks", "stop", "scale", "attach")
NAMES = ("list", *JOB_COMMANDS, "clean", "pool", "config", "doctor", "bench")


class CommandError(Exception):
    """A command refused, in one line for the user."""


def settings() -> dict[str, config.Setting]:
    """The effective settings, applied (a bad config file is a :class:`CommandError`)."""
    try:
        return config.apply()
    except config.ConfigError as exc:
        raise CommandError(str(exc)) from None


def add_commands(sub: Any) -> dict[str, argparse.ArgumentParser]:
    """Add every command's parser to ``sub`` (an ``add_subparsers`` result); return them
    by name (``bench``'s arguments are the caller's: the two front ends show it apart)."""
    parsers = {"list": sub.add_parser("list", help="list every job")}
    parsers["bench"] = sub.add_parser("bench", help="images/sec and scaling efficiency per backend")
    parsers["pool"] = sub.add_parser(
        "pool", help="list the warm pools (idle processes, memory) and kept ssh connections"
    )
    parsers["pool"].add_argument(
        "--clear",
        action="store_true",
        help="end every idle process and kept connection (one a running job uses: when it ends)",
    )
    parsers["config"] = sub.add_parser(
        "config", help="the effective settings and where each came from"
    )
    parsers["doctor"] = sub.add_parser(
        "doctor", help="what a job here would get (CPUs, memory, shared memory, network, GPUs)"
    )
    for name, text in (
        ("status", "show a job's state and its processes"),
        ("stop", "stop every process of a job"),
        ("attach", "reconnect to a job: its last lines, then its output until it ends"),
    ):
        parsers[name] = sub.add_parser(name, help=text)
        parsers[name].add_argument("job", help="a job id (or a unique prefix), or a session name")
    parsers["scale"] = scale = sub.add_parser(
        "scale", help="restart a job with N workers, from its checkpoint"
    )
    scale.add_argument("job")
    scale.add_argument("workers", type=int)
    parsers["clean"] = clean = sub.add_parser(
        "clean", help="remove finished jobs (never a running one)"
    )
    clean.add_argument("jobs", nargs="*", help="these jobs only (default: every finished job)")
    clean.add_argument("--keep", type=int, default=0, help="keep the newest N finished jobs")
    clean.add_argument(
        "--older-than", type=float, default=None, metavar="DAYS", help="only jobs ended before"
    )
    parsers["logs"] = logs = sub.add_parser("logs", help="print a job's logs")
    logs.add_argument("job")
    logs.add_argument("--rank", type=int, default=None, help="only this rank's log")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="then print new lines until the job ends"
    )
    parsers["stacks"] = stacks = sub.add_parser(
        "stacks",
        help="where every process of a running job is: its Python stacks, grouped "
        "(an ended job: the last ones taken)",
    )
    stacks.add_argument("job")
    stacks.add_argument("--json", action="store_true", help="the report as JSON, groups included")
    stacks.add_argument(
        "--native",
        action="store_true",
        help="with each process's native frames (py-spy, where installed; processes here only)",
    )
    return parsers


def job_line(job: Job, status: JobStatus | None = None) -> str:
    """One line for a job: id, state, workers, backend/launcher, when it was created, and
    the session's name for a session."""
    listed, spec = job.listed()
    status = listed if status is None or spec is None else status
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(status.created or 0))
    if spec is None:
        return f"{job.id:<24} {status.state:<10} {status.error}"
    session = f"  session {spec.session}" if spec.session is not None else ""
    return (
        f"{job.id:<24} {status.state:<10} {spec.workers:>3} workers  "
        f"{spec.backend}/{spec.launcher}  {created}{session}"
    )


def print_status(job: Job, gpu_text: Callable[[Any], str] = lambda process: "") -> JobStatus:
    """The job's line, its error, and a line per process; returns the status shown."""
    status = job.status()
    print(job_line(job, status))
    if status.restarts:
        restarts = [w for w in status.warnings if w.startswith("restart ")]
        print(f"restarts: {status.restarts} ({restarts[-1] if restarts else 'after a failure'})")
    if status.error:
        print(f"error: {status.error}")
    for p in [*status.processes, *status.helpers]:
        code = "" if p.exit_code is None else f" (exit {p.exit_code})"
        label, pid = str(p.id), p.pid or "-"
        gpus = f"  gpu {','.join(p.gpus)}" if p.gpus else ""
        gpus += f" ({gpu_text(p)})" if gpu_text(p) else ""
        warm = "  (warm, from the pool)" if p.pooled else ""
        print(f"  {label:<10} pid {pid:<8} {p.host:<12} {p.state}{code}{gpus}{warm}")
    return status


def print_pools(clear: bool) -> None:
    """The warm pools, a line each, here and wherever a launcher's jobs started one (the
    ssh hosts, the Ray clusters' nodes), and the connections launchers keep between jobs
    (``clear``: end their idle processes and let the connections go instead, those
    running jobs use once the jobs end)."""
    from ..plugins import LAUNCHERS, launcher_kind, plugin_names
    from ..pool import client

    launchers = [launcher_kind(name) for name in plugin_names(LAUNCHERS)]

    def remote_pools(drain: bool) -> dict[str, Any]:
        return {k: v for cls in launchers for k, v in cls.remote_pools(drain).items()}

    if clear:
        hosts = remote_pools(drain=True)
        print(f"Asked {client.drain()} pool(s) to end their idle processes.")
        for host, answer in hosts.items():
            said = answer if isinstance(answer, str) else f"asked {len(answer)} pool(s)"
            print(f"  on {host}: {said}")
        closed = [place for cls in launchers for place in cls.retire_kept()]
        if closed:
            print(
                f"Closed the connections kept to {', '.join(closed)} "
                "(one a running job uses ends with that job)."
            )
        return
    for cls in launchers:
        for line in cls.kept_connections():
            print(line)
    pools = [("", info) for info in client.list_pools()]
    for host, answer in remote_pools(drain=False).items():
        if isinstance(answer, str):
            print(f"on {host}: cannot list its pools: {answer}")
            continue
        pools += [(host, info) for info in answer]
    if not pools:
        print(
            "no warm pools (one fills after a job of the horovod, tf, ps, torch or jax "
            "backend ends)"
        )
    for host, info in pools:
        zygote = ""
        if info.zygote:
            zygote = f", zygote pid {info.zygote}" + ("" if info.zygote_ready else " (importing)")
        print(
            f"{f'on {host}: ' if host else ''}{info.name}: {info.kind} for {info.python}; "
            f"keeper pid {info.keeper}; {len(info.idle)} idle, {len(info.starting)} "
            f"starting, {len(info.claimed)} running a job{zygote}; "
            f"{info.memory_bytes / 2**20:.0f} MiB idle; ends after {info.idle_seconds:g} s unused"
        )
        if info.error:
            print(f"  error: {info.error}")


def clean(args: argparse.Namespace, prog: str) -> None:
    """Remove finished jobs as ``args`` say (never a running one)."""
    if args.keep < 0 or (args.older_than is not None and args.older_than < 0):
        raise CommandError(f"{prog} clean: --keep and --older-than take numbers >= 0")
    try:
        removed = retention.clean(args.jobs, args.keep, args.older_than)
    except (KeyError, ValueError) as exc:
        raise CommandError(f"{prog} clean: {exc.args[0]}") from None
    if removed:
        print(f"removed {len(removed)} finished job(s): {', '.join(removed)}")
    else:
        print("no finished job to remove")


def attached(job: Job, view: Any, status: JobStatus, prog: str) -> str:
    """Follow a job from each process's last lines (its ``view`` rebuilt from the store),
    until it ends or the user interrupts, which detaches and leaves the job running; a
    job that has ended shows its last lines and its end. Returns its state."""
    print(f"Attached to job {job.id} ({status.state}).", flush=True)
    try:  # an interrupt detaches: only the cell that started a job stops it
        return follow(job, view, from_start=False, last=ATTACH_LINES, stop_on_interrupt=False)
    except KeyboardInterrupt:
        print(f"Detached; job {job.id} goes on (`{prog} stop {job.id}` stops it).")
        return job.status().state
    except JobFailed:
        return "failed"


def follow_logs(job: Job, rank: int | None) -> str:
    """Every new line of the job's logs (one rank's, or every process's with its label)
    until the job ends; an interrupt stops following, never the job."""
    only = None if rank is None else {ProcessId("worker", rank)}
    try:
        return follow(job, None, stop_on_interrupt=False, only=only)
    except JobFailed:
        return "failed"
    except KeyboardInterrupt:
        print(f"Stopped following; job {job.id} goes on.")
        return job.status().state


def run(
    args: argparse.Namespace,
    prog: str,
    make_view: Callable[[Job], Any],
    gpu_text: Callable[[Any], str] = lambda process: "",
) -> tuple[int, Any]:
    """Carry out the command in ``args.command`` (not ``bench``); return its exit status
    and what the magic returns (the job for ``attach``)."""
    if args.command == "list":
        jobs = Job.list()
        print("\n".join(job_line(j) for j in jobs) if jobs else "no jobs")
        return EXIT_OK, None
    if args.command == "pool":
        print_pools(clear=args.clear)
        return EXIT_OK, None
    if args.command == "clean":
        clean(args, prog)
        return EXIT_OK, None
    if args.command == "config":
        print(config.table(settings()))
        return EXIT_OK, None
    if args.command == "doctor":
        from ..plugins import launcher_kind

        print("A local job here gets:")
        print("\n".join(f"  {line}" for line in launcher_kind("local").doctor()))
        return EXIT_OK, None
    try:
        job = Job.attach(args.job)
    except KeyError as exc:  # a running session by its name, else the job id's error
        job = sessions.find(args.job)
        if job is None:
            raise CommandError(str(exc.args[0])) from None
    failed = {True: EXIT_FAILED, False: EXIT_OK}
    if args.command == "status":
        return failed[print_status(job, gpu_text).state == "failed"], None
    if args.command == "logs":
        return _logs(job, args), None
    if args.command == "stacks":
        report = _stacks(job, args.native)
        print(json.dumps(report.model(), indent=1) if args.json else report.text())
        return EXIT_OK, None
    if args.command == "stop":
        state = job.stop()
        print(f"Job {job.id} {state}.")
        return EXIT_OK, None
    if args.command == "scale":
        if job.done:
            raise CommandError(f"cannot scale {job.id}: it has ended ({job.state})")
        try:
            job.scale(args.workers)
        except (ValueError, OSError, RuntimeError) as exc:
            raise CommandError(f"cannot scale {job.id}: {exc}") from None
        print(f"Job {job.id}: scaling to {args.workers} workers {job.scaling_mode}.")
        return EXIT_OK, None
    if args.command == "attach":
        state = attached(job, make_view(job), job.status(), prog)
        status = print_status(job, gpu_text)
        return failed[state == "failed" or status.state == "failed"], job
    raise CommandError(f"{prog}: unknown command {args.command}")


def _stacks(job: Job, native: bool) -> StacksReport:
    """Stacks taken now, or the last ones kept when the job has ended."""
    try:
        report, kept = job.latest_stacks(native)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from None
    if kept:
        print(f"Job {job.id} has ended ({job.state}); the last stacks taken while it ran:")
    return report


def _logs(job: Job, args: argparse.Namespace) -> int:
    process = None if args.rank is None else ProcessId("worker", args.rank)
    if args.follow:
        if process is not None and not job.dir.log_file(process).exists():
            raise CommandError(f"job {job.id} has no log for worker {args.rank}")
        return EXIT_FAILED if follow_logs(job, args.rank) == "failed" else EXIT_OK
    try:
        print(job.logs(process))
    except KeyError as exc:
        raise CommandError(str(exc.args[0])) from None
    return EXIT_OK
