"""The server of the UI tests (see start-server.sh): Galata's test helpers, no token, only
on 127.0.0.1, under a JupyterHub user's base URL (UI_TESTS_BASE_PATH, set by
playwright.config.js), serving JupyterLab and Notebook 7, with the extension's settings
from an overrides.json as an admin of a shared platform would set them. As in Galata's
own configuration the XSRF check is off (Galata's contents helper sends no token);
tests/test_server.py checks the REST API's XSRF handling."""

import os
from pathlib import Path

import jupyterlab

c = get_config()  # noqa: F821
base = Path(os.environ["UI_TESTS_BASE"])
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = int(os.environ.get("UI_TESTS_PORT", "8917"))
c.ServerApp.port_retries = 0
c.ServerApp.base_url = os.environ.get("UI_TESTS_BASE_PATH", "/user/alice/")
c.ServerApp.open_browser = False
c.ServerApp.root_dir = str(base / "notebooks")
c.FileContentsManager.always_delete_dir = True  # a test's folder goes with its files
c.FileContentsManager.delete_to_trash = False
c.IdentityProvider.token = ""
c.ServerApp.password = ""
c.ServerApp.disable_check_xsrf = True
c.LabApp.expose_app_in_browser = True
c.LabApp.workspaces_dir = str(base / "workspaces")
# overrides.json: the settings start-server.sh writes (LabApp's and Notebook 7's own)
c.LabApp.app_settings_dir = str(base / "settings")
c.JupyterNotebookApp.app_settings_dir = str(base / "settings")
c.JupyterNotebookApp.expose_app_in_browser = True
c.LabServerApp.extra_labextensions_path = str(Path(jupyterlab.__file__).parent / "galata")
c.ServerApp.jpserver_extensions = {"jupyter_distrain": True}
c.ServerApp.log_level = "ERROR"
