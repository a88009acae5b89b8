"""The Jupyter server extension: the job store as REST resources under ``/distrain/``.

Enabled by ``pip install`` (the ``jupyter-config`` data file); every route needs
Jupyter's authentication, and its XSRF check for requests that change something.

While a job of the user runs, the server counts as active (:func:`report_activity`),
so that a JupyterHub idle culler does not stop it under a training job; the sidebar's
polls of the routes do not count (the handlers' reads are not activity).

How the server extension works
------------------------------

REST under `<base_url>/distrain/`, one handler per resource (dask-labextension's
shape): `jobs`, `jobs/<id>` (`GET`, `PATCH {"workers": n}` to scale, `DELETE` to
stop), `jobs/<id>/logs` (`tail=N` from the end, or `offset=` for what was written
since: the answer's `offset` is where the next read starts) and `jobs/<id>/metrics`
(`since=` a byte offset of `metrics.jsonl`). Reads are bounded (256 KiB, 5,000
records); nothing is written but through the job's control channel, except
`DELETE /distrain/jobs` (remove finished jobs, `client/retention.clean`). `flags` serves
the flag table (the form's fields) and `POST flags/check` answers what the magic would
refuse a line with (a read). Every route is `@authenticated` and `@authorized` on the
`distrain` resource (`read` for GET, `write` for PATCH/DELETE: a read-only authorizer
forbids changes); scale, stop and
clean run off the event loop, and finished jobs' models are kept until their files
change; `PATCH`/`DELETE` from a browser session need the XSRF token (tested
with a real login cookie). Enabled on install by
`jupyter-config/jupyter_server_config.d/jupyter_distrain.json`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

from jupyter_server._tz import utcnow
from tornado.ioloop import PeriodicCallback

from ..client import config
from ..contract.process import Env
from ..contract.store import list_job_dirs
from .handlers import routes

log = logging.getLogger(__name__)

# jupyter_server's ServerApp.last_activity() counts every setting whose name ends so
ACTIVITY_SETTING = "distrain_last_activity"
ACTIVITY_SECONDS = 60.0


def report_activity(settings: MutableMapping[str, Any]) -> bool:
    """Mark the server active now if a job runs (its supervisor holds the job's lock)."""
    if not any(job_dir.supervisor_alive() for job_dir in list_job_dirs()):
        return False
    settings[ACTIVITY_SETTING] = utcnow()
    return True


def activity_seconds(environ: MutableMapping[str, str] = os.environ) -> float:
    """``JUPYTER_DISTRAIN_ACTIVITY_SECONDS``: how often to look (0 turns it off)."""
    text = environ.get(Env.ACTIVITY_SECONDS, "")
    try:
        seconds = float(text) if text else ACTIVITY_SECONDS
    except ValueError:
        log.warning("jupyter_distrain: %s=%r is not a number; using %g", Env.ACTIVITY_SECONDS,
                    text, ACTIVITY_SECONDS)  # fmt: skip
        return ACTIVITY_SECONDS
    return max(0.0, seconds)


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Register the handlers with the server's web application; report running jobs
    as activity."""
    web_app = server_app.web_app
    try:
        config.apply()
    except config.ConfigError as exc:
        server_app.log.error("jupyter_distrain: %s", exc)
    web_app.add_handlers(".*$", routes(web_app.settings["base_url"]))
    server_app.log.info(
        "jupyter_distrain: jobs served under %sdistrain/", web_app.settings["base_url"]
    )
    seconds = activity_seconds()
    if seconds > 0:
        reporter = PeriodicCallback(lambda: report_activity(web_app.settings), seconds * 1000)
        reporter.start()
        web_app.settings["distrain_activity_reporter"] = reporter
