"""The Jupyter server extension: the job store as REST resources under ``/distrain/``.

Enabled by ``pip install`` (the ``jupyter-config`` data file); every route needs
Jupyter's authentication, and its XSRF check for requests that change something.
"""

from __future__ import annotations

from typing import Any

from .handlers import routes


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Register the handlers with the server's web application."""
    web_app = server_app.web_app
    web_app.add_handlers(".*$", routes(web_app.settings["base_url"]))
    server_app.log.info(
        "jupyter_distrain: jobs served under %sdistrain/", web_app.settings["base_url"]
    )
