"""``%%distributed`` and ``%distributed``: parse flags, call the API, print. Nothing else."""

from __future__ import annotations

import sys
import types
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser, magic_arguments, parse_argstring

from ..contract.cellcheck import elastic_warnings, undefined_names
from ..contract.session import INLINE_OUT_BYTES
from ..contract.spec import JobSpec, SpecError
from . import api, bench, commands, config
from . import session as sessions
from .flags import flag_arguments, spec_from_args
from .follow import follow, follow_async
from .job import Job
from .widget import JobWidget, TextSummary, follow_in_background, gpu_text, make_view


def _shape(spec: JobSpec) -> str:
    shape = f"{spec.workers} worker{'s' if spec.workers != 1 else ''}"
    return shape + (f", {spec.ps} ps" if spec.ps else "")


def _backend_text(spec: JobSpec) -> str:
    return f"horovod/{spec.controller}" if spec.backend == "horovod" else spec.backend


def _flag_defaults() -> dict[str, Any]:
    """The flags' defaults from the config files (a bad file is a UsageError)."""
    try:
        return config.flag_defaults(commands.settings())
    except commands.CommandError as exc:
        raise UsageError(str(exc)) from None


def checked_spec(line: str, cell: str) -> tuple[api.Checked, Any]:
    """The spec a ``%%distributed`` line (the words after the magic's name; the flags'
    defaults from the config files) describes for ``cell``, checked once (``api.check``:
    submit takes it as it is), and the parsed flags; a :class:`UsageError` with the
    magic's one-line message where it would refuse them."""
    magic = DistributedMagics.distributed
    magic.parser.set_defaults(**_flag_defaults())
    args = parse_argstring(magic, line)
    try:
        return api.check(spec_from_args(args, cell)), args
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def line_error(line: str) -> str | None:
    """What ``%%distributed`` would refuse this line's flags with, in its words; None
    when it would take them (the JupyterLab form's check: ``POST /distrain/flags/check``).
    Backend and launcher names are checked at submit, as the magic does."""
    try:
        checked_spec(line, "")
    except UsageError as exc:
        return str(exc)
    return None


def _line_parser() -> MagicArgumentParser:
    """The line commands' arguments (bench's launcher flags: their defaults from the
    config files, as the cell's)."""
    parser = MagicArgumentParser(prog="%distributed", add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=MagicArgumentParser)
    bench.add_arguments(commands.add_commands(sub)["bench"], _flag_defaults())
    return parser


def _bench(args: Any) -> list[bench.BenchRow]:
    try:  # bad settings, or a launcher's pre-flight refusing the first run
        settings = bench.settings_from(args)
        rows, results = bench.run(settings, progress=lambda line: print(line, flush=True))
    except (SpecError, bench.BenchFailed) as exc:  # one line, no traceback
        raise UsageError(str(exc)) from None
    print(bench.table(rows))
    print(f"Saved in {results} (results.csv, results.json, chart.svg).")
    from IPython.display import SVG, display

    display(SVG(bench.chart_svg(rows)))
    return rows


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
        checked, args = checked_spec(line, cell)
        spec = checked.spec
        if spec.session is not None:
            run = self._session_cell(spec, args)
            run.follow()
            return self._bind_cell_out(run, spec)
        job, view = self._start(checked)
        if args.background:
            follow_in_background(job, view)
            return job
        follow(job, view, all_output=args.all_output)
        self._bind_out(job)
        return None

    async def distributed_async(self, line: str, cell: str) -> Any:
        """The cell form, when a kernel runs it as an async cell (see ``async_cell``)."""
        checked, args = checked_spec(line, cell)
        spec = checked.spec
        if spec.session is not None:
            run = self._session_cell(spec, args)
            if isinstance(run.view, JobWidget):  # comm messages handled while this waits
                run.view.keep_text_live(lines=True)
            await run.follow_async()
            return self._bind_cell_out(run, spec)
        job, view = self._start(checked)
        if args.background:
            follow_in_background(job, view)
            return job
        if isinstance(view, JobWidget):  # the kernel handles comm messages while this waits
            view.keep_text_live(lines=True)
        await follow_async(job, view, all_output=args.all_output)
        self._bind_out(job)
        return None

    def _start(self, checked: api.Checked) -> tuple[Job, JobWidget | TextSummary]:
        """Submit a checked spec; show the job's view."""
        try:
            self._warn_undefined(checked.spec)
            for warning in elastic_warnings(checked.spec.code):
                print(f"Warning: {warning}.", file=sys.stderr, flush=True)
            job = api.submit(checked, self.shell.user_ns)
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
        return job, make_view(job)

    def _session_cell(self, spec: JobSpec, args: Any) -> sessions.CellRun:
        """Start the session with this cell, or hand the cell to its running ranks."""
        if args.background:
            raise UsageError("--background is for jobs: a session's cell is followed")
        job = sessions.find(spec.session or "")
        if job is None:
            # checked above; owned() only names this kernel as the session's owner
            job, view = self._start(api.Checked(sessions.owned(spec)))
            print(
                f"Session {spec.session} started: later cells with --session "
                f"{spec.session} run in the same ranks",
                flush=True,
            )
            return sessions.CellRun(job, 0, view, args.all_output)
        try:
            sessions.check_same(job, spec)
            pushed = api.pickle_pushed(spec.push, self.shell.user_ns)
            view = make_view(job, from_start=False)
            out = (bool(spec.out), spec.out_all)
            return sessions.CellRun.send(job, spec.code, pushed, out, view, args.all_output)
        except SpecError as exc:
            raise UsageError(str(exc)) from None

    def _bind_cell_out(self, run: sessions.CellRun, spec: JobSpec) -> None:
        if run.job.done:  # the session ended during the cell (stopped): said by its view
            print(f"Session {spec.session} {run.job.state}.", flush=True)
            return
        values = run.outcome(bool(spec.out), every_rank=spec.out_all)
        if spec.out:
            if not values:
                raise sessions.CellFailed(
                    f"--out {spec.out}: rank 0's `result` did not come back (a rank on another "
                    f"host sends at most {INLINE_OUT_BYTES // 1024} KiB: return less, or save "
                    "it to a file the notebook can read)"
                )
            self.shell.user_ns[spec.out] = values if spec.out_all else values[0]

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
        if line.lstrip().startswith("-"):  # one % where the cell magic takes two
            raise UsageError(
                f"%distributed runs a job command ({', '.join(commands.NAMES)}); to run a "
                f"cell on workers, make `%%distributed {line.strip()}` its first line"
            )
        args = _line_parser().parse_argstring(line)
        if args.command is None:
            raise UsageError(f"%distributed needs a command: {', '.join(commands.NAMES)}")
        if args.command == "bench":
            return _bench(args)
        try:
            _, value = commands.run(args, "%distributed", make_view, gpu_text)
        except commands.CommandError as exc:
            raise UsageError(str(exc)) from None
        return value


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


# IPython's check_complete (a kernel's is_complete) skips the transformers marked so: a
# `%%` cell is complete at a blank line, and the await this one makes of it would end the
# cell at its first line (`jupyter console` then ran the magic line alone, with no body)
async_cell.has_side_effects = True  # type: ignore[attr-defined]


def register(shell: Any) -> None:
    """Register the magics, and the async form of the cell magic where a kernel runs."""
    shell.register_magics(DistributedMagics)
    if getattr(shell, "kernel", None) is not None and async_cell not in (
        shell.input_transformers_cleanup
    ):
        shell.input_transformers_cleanup.append(async_cell)
