"""The server of the UI tests (see start-server.sh): Galata's test helpers, no token, only
on 127.0.0.1. As in Galata's own configuration the XSRF check is off (Galata's contents
helper sends no token); tests/test_server.py checks the REST API's XSRF handling."""

import os
from pathlib import Path

import jupyterlab

c = get_config()  # noqa: F821
base = Path(os.environ["UI_TESTS_BASE"])
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = int(os.environ.get("UI_TESTS_PORT", "8917"))
c.ServerApp.port_retries = 0
c.ServerApp.open_browser = False
c.ServerApp.root_dir = str(base / "notebooks")
c.IdentityProvider.token = ""
c.ServerApp.password = ""
c.ServerApp.disable_check_xsrf = True
c.LabApp.expose_app_in_browser = True
c.LabApp.workspaces_dir = str(base / "workspaces")
c.LabServerApp.extra_labextensions_path = str(Path(jupyterlab.__file__).parent / "galata")
c.ServerApp.jpserver_extensions = {"jupyter_distrain": True}
c.ServerApp.allow_root = True  # CI runs as root
c.ServerApp.log_level = "ERROR"
