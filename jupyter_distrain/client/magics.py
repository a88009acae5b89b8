"""``%%distributed`` and ``%distributed``: parse flags, call the API, print. Nothing else."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser, magic_arguments, parse_argstring

from ..contract import retention
from ..contract.cellcheck import elastic_warnings, undefined_names
from ..contract.process import ProcessId
from ..contract.spec import JobSpec, SpecError
from ..contract.status import JobStatus
from . import api, bench
from .flags import flag_arguments, spec_from_args
from .follow import follow, follow_async
from .job import Job, JobFailed
from .widget import JobWidget, TextSummary, follow_in_background, gpu_text, make_view


def _job_line(job: Job, status: JobStatus | None = None) -> str:
    status = job.status() if status is None else status
    spec = job.spec
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(status.created or 0))
    return (
        f"{job.id:<24} {status.state:<10} {spec.workers:>3} workers  "
        f"{spec.backend}/{spec.launcher}  {created}"
    )


def _shape(spec: JobSpec) -> str:
    shape = f"{spec.workers} worker{'s' if spec.workers != 1 else ''}"
    return shape + (f", {spec.ps} ps" if spec.ps else "")


def _backend_text(spec: JobSpec) -> str:
    return f"horovod/{spec.controller}" if spec.backend == "horovod" else spec.backend


def _line_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(prog="%distributed", add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=MagicArgumentParser)
    sub.add_parser("list", help="list every job")
    bench_parser = sub.add_parser("bench", help="images/sec and scaling efficiency per backend")
    bench.add_arguments(bench_parser)
    pool = sub.add_parser("pool", help="list the warm pools (idle processes, memory)")
    pool.add_argument("--clear", action="store_true", help="end every idle pooled process")
    for name, text in (
        ("status", "show a job's state and its processes"),
        ("stop", "stop every process of a job"),
        ("attach", "reconnect to a job: stream its output until it ends"),
    ):
        sub.add_parser(name, help=text).add_argument("job")
    scale = sub.add_parser("scale", help="restart a job with N workers, from its checkpoint")
    scale.add_argument("job")
    scale.add_argument("workers", type=int)
    clean = sub.add_parser("clean", help="remove finished jobs (never a running one)")
    clean.add_argument("jobs", nargs="*", help="these jobs only (default: every finished job)")
    clean.add_argument("--keep", type=int, default=0, help="keep the newest N finished jobs")
    clean.add_argument(
        "--older-than", type=float, default=None, metavar="DAYS", help="only jobs ended before"
    )
    logs = sub.add_parser("logs", help="print a job's logs")
    logs.add_argument("job")
    logs.add_argument("--rank", type=int, default=None, help="only this rank's log")
    return parser


def _bench(args: Any) -> list[bench.BenchRow]:
    try:  # bad settings, or a launcher's pre-flight refusing the first run
        settings = bench.settings_from(args)
        rows, results = bench.run(settings, progress=lambda line: print(line, flush=True))
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    print(bench.table(rows))
    print(f"Saved in {results} (results.csv, results.json, chart.svg).")
    from IPython.display import SVG, display

    display(SVG(bench.chart_svg(rows)))
    return rows


def _clean(args: Any) -> None:
    if args.keep < 0 or (args.older_than is not None and args.older_than < 0):
        raise UsageError("%distributed clean: --keep and --older-than take numbers >= 0")
    try:
        removed = retention.clean(args.jobs, args.keep, args.older_than)
    except (KeyError, ValueError) as exc:
        raise UsageError(f"%distributed clean: {exc.args[0]}") from None
    if removed:
        print(f"removed {len(removed)} finished job(s): {', '.join(removed)}")
    else:
        print("no finished job to remove")


def _print_pools(clear: bool) -> None:
    from ..pool import client

    if clear:
        print(f"Asked {client.drain()} pool(s) to end their idle processes.")
        return
    pools = client.list_pools()
    if not pools:
        print("no warm pools (one fills after a job of the horovod, tf or ps backend ends)")
    for info in pools:
        print(
            f"{info.name}: {info.kind} for {info.python}; keeper pid {info.keeper}; "
            f"{len(info.idle)} idle, {len(info.starting)} starting, {len(info.claimed)} running "
            f"a job; {info.memory_bytes / 2**20:.0f} MiB idle; ends after "
            f"{info.idle_seconds:g} s unused"
        )
        if info.error:
            print(f"  error: {info.error}")


@magics_class
class DistributedMagics(Magics):
    """The ``distributed`` magic. Line form: ``%distributed list|status|logs|stop|attach``."""

    @magic_arguments()
    @flag_arguments()
    @line_cell_magic
    def distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on many workers; the cell body is shipped as train.py.

        As a line magic: ``%distributed list | status JOB | logs JOB [--rank N] | stop JOB |
        scale JOB N | attach JOB``.
        """
        if cell is None:
            return self._line_command(line)
        job, args, view = self._start(line, cell)
        if args.background:
            follow_in_background(job, view)
            return job
        follow(job, view, all_output=args.all_output)
        self._bind_out(job)
        return None

    async def distributed_async(self, line: str, cell: str) -> Any:
        """The cell form, when a kernel runs it as an async cell (see ``async_cell``)."""
        job, args, view = self._start(line, cell)
        if args.background:
            follow_in_background(job, view)
            return job
        await follow_async(job, view, all_output=args.all_output)
        self._bind_out(job)
        return None

    def _start(self, line: str, cell: str) -> tuple[Job, Any, JobWidget | TextSummary]:
        """Parse, check and submit; show the job's view."""
        args = parse_argstring(self.distributed, line)
        try:
            spec = spec_from_args(args, cell).validate()
            self._warn_undefined(spec)
            for warning in elastic_warnings(spec.code):
                print(f"Warning: {warning}.", file=sys.stderr, flush=True)
            job = api.submit(spec, self.shell.user_ns)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        spec = job.spec  # as submitted: the backend resolved
        print(
            f"Job {job.id}: {_shape(spec)}; backend {_backend_text(spec)} "
            f"({job.backend_reason}); launcher {spec.launcher}",
            flush=True,
        )
        for note in job.notes:
            print(note, flush=True)
        return job, args, make_view(job)

    def _bind_out(self, job: Job) -> None:
        out = job.spec.out
        if out:
            self.shell.user_ns[out] = job.result()

    def _warn_undefined(self, spec: JobSpec) -> None:
        names = [n for n in undefined_names(spec.code) if n not in spec.push]
        if not names:
            return
        user_ns = self.shell.user_ns
        modules = [n for n in names if isinstance(user_ns.get(n), types.ModuleType)]
        variables = [n for n in names if n in user_ns and n not in modules]
        hints = []
        if variables:
            hints.append(f"send notebook variables with --push {','.join(variables)}")
        if modules or len(variables) < len(names):
            hints.append("import modules inside the cell")
        print(
            f"Warning: the cell uses {', '.join(names)} without defining them "
            f"(workers do not see the notebook's globals): {'; '.join(hints)}.",
            file=sys.stderr,
            flush=True,
        )

    # --- %distributed COMMAND --------------------------------------------------
    def _line_command(self, line: str) -> Any:
        args = _line_parser().parse_argstring(line)
        if args.command is None:
            raise UsageError(
                "%distributed needs a command: "
                "list, status, logs, stop, scale, attach, clean, pool or bench"
            )
        if args.command == "list":
            jobs = Job.list()
            print("\n".join(_job_line(j) for j in jobs) if jobs else "no jobs")
            return None
        if args.command == "pool":
            _print_pools(clear=args.clear)
            return None
        if args.command == "bench":
            return _bench(args)
        if args.command == "clean":
            _clean(args)
            return None
        try:
            job = Job.attach(args.job)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        if args.command == "status":
            self._print_status(job)
        elif args.command == "logs":
            try:
                print(job.logs(None if args.rank is None else ProcessId("worker", args.rank)))
            except KeyError as exc:
                raise UsageError(str(exc.args[0])) from None
        elif args.command == "stop":
            print(f"Job {job.id} {job.stop()}.")
        elif args.command == "scale":
            try:
                job.scale(args.workers)
            except (ValueError, OSError, RuntimeError) as exc:
                raise UsageError(f"cannot scale {job.id}: {exc}") from None
            print(f"Job {job.id}: scaling to {args.workers} workers {job.scaling_mode}.")
        elif args.command == "attach":
            return self._attach(job)
        return None

    @staticmethod
    def _print_status(job: Job) -> None:
        status = job.status()
        print(_job_line(job, status))
        if status.error:
            print(f"error: {status.error}")
        for p in [*status.processes, *status.helpers]:
            code = "" if p.exit_code is None else f" (exit {p.exit_code})"
            label, pid = str(p.id), p.pid or "-"
            gpus = f"  gpu {','.join(p.gpus)}" if p.gpus else ""
            gpus += f" ({gpu_text(p)})" if gpu_text(p) else ""
            warm = "  (warm, from the pool)" if p.pooled else ""
            print(f"  {label:<10} pid {pid:<8} {p.host:<12} {p.state}{code}{gpus}{warm}")

    def _attach(self, job: Job) -> Job:
        status = job.status()
        print(f"Attached to job {job.id} ({status.state}).", flush=True)
        view = make_view(job)  # rebuilt from the store: the whole history
        if status.done:
            view.refresh(force=True)
        else:
            try:  # an interrupt detaches: only the cell that started a job stops it
                follow(job, view, from_start=False, stop_on_interrupt=False)
            except KeyboardInterrupt:
                print(f"Detached; job {job.id} goes on (`%distributed stop {job.id}` stops it).")
            except JobFailed:
                pass
        self._print_status(job)
        return job


CELL_MAGIC = "%%distributed"


def async_cell(lines: list[str]) -> list[str]:
    """An IPython input transformer: in a kernel, run ``%%distributed`` cells as async cells.

    The cell becomes one ``await`` of :meth:`DistributedMagics.distributed_async`, so
    the kernel's event loop is free while the job runs: widget events (Stop, scale,
    Logs) are handled, and the next cell still waits for this one to finish.
    """
    if not lines or not lines[0].startswith(CELL_MAGIC):
        return lines
    first = lines[0].rstrip("\n")
    arguments = first[len(CELL_MAGIC) :]
    if arguments and not arguments[0].isspace() or first.endswith("?"):
        return lines  # another magic's name, or a help request
    body = "".join(lines[1:])
    # `{name}` and `$name` in the line are expanded from the notebook, as IPython's own
    # cell-magic call does (it is bypassed here); at the cell's top level, as there
    return [
        "await get_ipython().find_cell_magic('distributed').__self__.distributed_async("
        f"get_ipython().var_expand({arguments.strip()!r}), {body!r})\n"
    ]


def register(shell: Any) -> None:
    """Register the magics, and the async form of the cell magic where a kernel runs."""
    shell.register_magics(DistributedMagics)
    if getattr(shell, "kernel", None) is not None and async_cell not in (
        shell.input_transformers_cleanup
    ):
        shell.input_transformers_cleanup.append(async_cell)
