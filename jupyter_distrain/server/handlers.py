"""One REST handler per resource: the jobs, one job, its logs, its metrics, its stacks, the
``%%distributed`` flags (the form's fields, and the magic's check of a line).

Reads are bounded and incremental: a log is read from its end (``tail``) or from a
byte offset the client got from its last read (``offset``), metrics from the offset
of the last record read (``since``); never the whole file per poll. A finished job's
model is kept until its files change, so a store of many old jobs is not reparsed on
every poll. Scale and stop talk to the job's supervisor (up to seconds) off the event
loop. Every route is authenticated and then authorized on the ``distrain`` resource
(``read`` for GET, ``write`` for PATCH/DELETE), so a read-only authorizer can forbid
changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop

from ..client import retention
from ..client.flags import flag_models
from ..client.job import Job, NoStacks
from ..client.magics import line_error
from ..contract.process import ProcessId
from ..contract.status import FINAL_STATES
from ..contract.store import JOB_ID_RE, JobDir, find_job_dir, list_job_dirs
from ..contract.tail import LineReader, last_lines
from .models import job_model

MAX_TAIL_LINES = 5000
MAX_READ_BYTES = 256 * 1024  # one incremental read of a log or of the metrics
MAX_RECORDS = 5000
MAX_LINE_CHARS = 16 * 1024  # a %%distributed line the form asks about
AUTH_RESOURCE = "distrain"  # what a Jupyter authorizer is asked about


def _job(job_id: str) -> Job:
    """The job ``job_id`` (exactly), or 404."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise web.HTTPError(404, f"no job {job_id!r}")
    try:
        job_dir = find_job_dir(job_id)
    except (KeyError, OSError):
        raise web.HTTPError(404, f"no job {job_id!r}") from None
    if job_dir.id != job_id:  # a prefix: the API names jobs exactly
        raise web.HTTPError(404, f"no job {job_id!r}")
    return Job(job_dir)


def _lines_after(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines written after byte ``offset`` (a bounded read), and the offset
    after the last of them (a line still being written is read next time). A line
    longer than one read (a ``\r`` progress bar) comes in pieces of one read each, so
    the offset always moves on."""
    reader = LineReader(path)
    reader.offset = offset
    lines = reader.read(MAX_READ_BYTES)
    if not lines and reader.behind:
        piece = reader.flush()
        return piece, offset + sum(len(p) for p in piece)
    return lines, offset + sum(len(line) + 1 for line in lines)


class ModelCache:
    """The models of finished jobs, each kept while its ``state.json`` and ``spec.json``
    are unchanged (a finished job's files change only when it is removed or edited by
    hand); a live job's model is made anew on every request."""

    def __init__(self) -> None:
        self._models: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}

    @staticmethod
    def _stamp(job_dir: JobDir) -> tuple[int, ...]:
        stamp: list[int] = []
        for path in (job_dir.state_file, job_dir.spec_file):
            try:
                info = path.stat()
            except OSError:
                return ()
            stamp += [info.st_mtime_ns, info.st_size, info.st_ino]
        return tuple(stamp)

    def models(self, job_dirs: list[JobDir]) -> list[dict[str, Any]]:
        """The model of every job in ``job_dirs``; entries of jobs no longer there go."""
        fresh: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}
        out = []
        for job_dir in job_dirs:
            stamp = self._stamp(job_dir)
            kept = self._models.get(job_dir.path)
            if stamp and kept is not None and kept[0] == stamp:
                model = kept[1]
            else:
                model = job_model(Job(job_dir), processes=False)
            if stamp and model["state"] in FINAL_STATES:
                fresh[job_dir.path] = (stamp, model)
            out.append(model)
        self._models = fresh
        return out


def _int_argument(handler: APIHandler, name: str, default: int, low: int, high: int) -> int:
    raw = handler.get_query_argument(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPError(400, f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise web.HTTPError(400, f"{name} must be between {low} and {high}, got {value}")
    return value


class DistrainHandler(APIHandler):
    """What every route of the extension shares: the resource it is authorized on, and
    that only requests changing something count as the user's activity (the sidebar
    polls the reads; a running job is reported as activity on its own)."""

    auth_resource = AUTH_RESOURCE

    @property
    def _track_activity(self) -> bool:  # type: ignore[override]
        return self.request.method not in ("GET", "HEAD")

    def _body(self, shape: str, empty: str = "null") -> dict[str, Any]:
        """The request's JSON object (``shape``: what the 400 names); ``empty``: what a
        request without a body means."""
        try:
            body = json.loads(self.request.body or empty)
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, f"the body must be a JSON object: {shape}")
        return body


class JobsHandler(DistrainHandler):
    """``GET /distrain/jobs``: every job, newest first; ``DELETE`` removes finished jobs
    (every one, or past the newest ``keep``; never a running one) and answers the ids."""

    cache = ModelCache()

    @web.authenticated
    @authorized
    def get(self) -> None:
        jobs = self.cache.models(list_job_dirs())
        jobs.sort(key=lambda j: j["created"] or 0, reverse=True)
        self.finish(json.dumps({"jobs": jobs}))

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        keep = _int_argument(self, "keep", 0, 0, 2**31)
        removed = await IOLoop.current().run_in_executor(None, lambda: retention.clean(keep=keep))
        self.finish(json.dumps({"removed": removed}))


class JobHandler(DistrainHandler):
    """``GET``, ``PATCH`` (``{"workers": n}``: scale) and ``DELETE`` (stop) one job."""

    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        self.finish(json.dumps(job_model(_job(job_id))))

    @web.authenticated
    @authorized
    async def patch(self, job_id: str) -> None:
        job = _job(job_id)
        body = self._body('{"workers": N}')
        workers = body.get("workers")
        if set(body) != {"workers"} or not isinstance(workers, int) or isinstance(workers, bool):
            raise web.HTTPError(400, 'the body must be {"workers": N} with a whole number N')
        if workers < 1:
            raise web.HTTPError(400, f"workers must be >= 1, got {workers}")
        if job.done:
            raise web.HTTPError(409, f"job {job_id} has ended: it cannot scale")
        try:
            await IOLoop.current().run_in_executor(None, job.scale, workers)
        except (ValueError, RuntimeError, OSError) as exc:
            raise web.HTTPError(409, str(exc)) from None
        self.finish(json.dumps(job_model(job)))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        job = _job(job_id)
        await IOLoop.current().run_in_executor(None, lambda: job.stop(wait=False))
        self.set_status(202)
        self.finish(json.dumps(job_model(job)))


class LogsHandler(DistrainHandler):
    """``GET /distrain/jobs/<id>/logs?process=worker-0``: the last ``tail`` lines (default
    100), or with ``offset`` the lines written since that byte offset (the answer's
    ``offset`` is where the next read starts)."""

    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        job = _job(job_id)
        logs = job.dir.log_files()
        name = self.get_query_argument("process", "")
        try:
            process = ProcessId.parse(name) if name else min(logs, default=None)
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None
        if process is None or process not in logs:
            raise web.HTTPError(404, f"job {job_id} has no log for {name or 'any process'}")
        path = logs[process]
        processes = [str(p) for p in sorted(logs)]
        if self.get_query_argument("offset", None) is None:
            tail = _int_argument(self, "tail", 100, 1, MAX_TAIL_LINES)
            lines = last_lines(path, tail).splitlines()
            offset = path.stat().st_size
        else:
            raw, offset = _lines_after(path, _int_argument(self, "offset", 0, 0, 2**62))
            lines = [line.decode(errors="replace") for line in raw]
        self.finish(
            json.dumps(
                {"process": str(process), "processes": processes, "lines": lines, "offset": offset}
            )
        )


class MetricsHandler(DistrainHandler):
    """``GET /distrain/jobs/<id>/metrics?since=OFFSET``: the metric records stored after
    that byte offset of ``metrics.jsonl`` (at most a bounded read), and the offset to
    ask from next."""

    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        job = _job(job_id)
        since = _int_argument(self, "since", 0, 0, 2**62)
        lines, offset = _lines_after(job.dir.metrics_file, since)
        if len(lines) > MAX_RECORDS:
            lines = lines[:MAX_RECORDS]
            offset = since + sum(len(line) + 1 for line in lines)
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:  # not a record (or a piece of an overlong line): skipped
                continue
        self.finish(json.dumps({"records": records, "since": offset}))


class StacksHandler(DistrainHandler):
    """``GET /distrain/jobs/<id>/stacks``: the last stacks taken (``"kept": true``), a
    read that signals nothing. ``POST`` (``{"native": false}``): every live process's
    stacks taken now without stopping the job (each is signalled: up to seconds, off
    the event loop), grouped (``StacksReport.model``); for an ended job the last ones
    taken while it ran. ``"native": true`` attaches py-spy to every process as well:
    authorized as ``execute``, since it runs a debugger against the user's processes."""

    @web.authenticated
    @authorized
    def get(self, job_id: str) -> None:
        kept = _job(job_id).kept_stacks()
        if not kept:
            raise web.HTTPError(404, f"no stacks of job {job_id} were taken yet: POST to take them")
        self.finish(json.dumps({**kept[-1].model(), "kept": True}))

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        job = _job(job_id)
        body = self._body('{"native": true|false}', empty="{}")
        if set(body) - {"native"} or not isinstance(body.get("native", False), bool):
            raise web.HTTPError(400, 'the body must be {"native": true|false}')
        native = body.get("native", False)
        if native and not self.authorizer.is_authorized(
            self, self.current_user, "execute", self.auth_resource
        ):
            raise web.HTTPError(403, "native stacks need the execute permission")
        try:
            report, kept = await IOLoop.current().run_in_executor(None, job.latest_stacks, native)
        except NoStacks as exc:
            raise web.HTTPError(404, str(exc)) from None
        except RuntimeError as exc:
            raise web.HTTPError(409, str(exc)) from None
        self.finish(json.dumps({**report.model(), "kept": kept}))


class FlagsHandler(DistrainHandler):
    """``GET /distrain/flags``: every ``%%distributed`` flag, in a written line's order,
    with the names ``--backend`` and ``--launcher`` take (the form's fields)."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.finish(json.dumps(flag_models()))


class LineCheckHandler(DistrainHandler):
    """``POST /distrain/flags/check`` with ``{"line": "--workers 2 ..."}``: what the magic
    would refuse those flags with, in its own words (``{"error": null}``: it would take
    them). Nothing is submitted; a read, so a read-only user's form checks too."""

    @web.authenticated
    @authorized("read")
    def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        line = body.get("line") if isinstance(body, dict) else None
        if not isinstance(line, str) or len(line) > MAX_LINE_CHARS:
            raise web.HTTPError(
                400, f'the body must be {{"line": text of at most {MAX_LINE_CHARS}}}'
            )
        self.finish(json.dumps({"error": line_error(line)}))


def routes(base_url: str) -> list[tuple[str, type[APIHandler]]]:
    """The extension's URL patterns under ``base_url``."""
    job = r"/distrain/jobs/(?P<job_id>[^/]+)"
    return [
        (url_path_join(base_url, pattern), handler)
        for pattern, handler in (
            (r"/distrain/jobs/?", JobsHandler),
            (job + "/?", JobHandler),
            (job + "/logs", LogsHandler),
            (job + "/metrics", MetricsHandler),
            (job + "/stacks", StacksHandler),
            (r"/distrain/flags/?", FlagsHandler),
            (r"/distrain/flags/check", LineCheckHandler),
        )
    ]
