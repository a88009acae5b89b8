"""A real JupyterHub for the tests (tests/test_hub.py) and the UI tests (run as
``python tests/hubserver.py PORT``: the hub until SIGTERM, its password in
``UI_TESTS_HUB_PASSWORD``): PyPI's jupyterhub, run as root as a hub that spawns local
users is, with configurable-http-proxy from the npm registry (tests/hub), the
DummyAuthenticator for the two test accounts, LocalProcessSpawner starting each
account's server from this checkout's virtualenv as that account, and, if asked,
jupyterhub-idle-culler as a hub service."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from conftest import wait_for
from useraccounts import ALICE, BOB, REPO

PROXY = REPO / "tests" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Hub:
    url: str  # the proxy's public URL, ending in /
    token: str  # the test service's (an admin of users and servers)

    def api(
        self, method: str, path: str, body: dict | None = None, token: str = ""
    ) -> tuple[int, dict]:
        """A request to ``url + path`` with ``token`` (the service's by default): its
        status (0: nothing listens) and JSON body ({} when it has none)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"token {token or self.token}"}
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except OSError:  # not listening (yet)
            return 0, {}
        try:
            return status, json.loads(raw or b"{}")
        except ValueError:
            return status, {}

    def server(self, user: str) -> dict | None:
        """``user``'s default server as the hub's API describes it (None: none)."""
        _, model = self.api("GET", f"hub/api/users/{user}")
        return model.get("servers", {}).get("")

    def spawn(self, user: str) -> str:
        """Start ``user``'s server afresh (one the culler may be about to end is stopped
        first); a token of theirs for it."""
        self.api("DELETE", f"hub/api/users/{user}/server")
        wait_for(lambda: self.server(user) is None, 60, what=f"{user}'s server stopped")
        status, _ = self.api("POST", f"hub/api/users/{user}/server")
        assert status in (201, 202), status
        wait_for(lambda: (self.server(user) or {}).get("ready"), 90, what=f"{user}'s server")
        status, made = self.api("POST", f"hub/api/users/{user}/tokens", {"note": "test"})
        assert status == 201, (status, made)
        return made["token"]


@contextlib.contextmanager
def jupyterhub(
    base: Path, port: int = 0, password: str = "", cull_seconds: int = 0
) -> Iterator[Hub]:
    """The hub (on ``port``, any free one by default; ``password`` logs in as either
    test account), its proxy and (``cull_seconds``) the idle culler, in ``base``;
    everything stopped at the end."""
    port, token = port or free_port(), secrets.token_hex(32)
    venv = Path(sys.executable).parent
    culler = [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={cull_seconds}"]
    config = f"""
c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{free_port()}/"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.db_url = "sqlite:///{base}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{base}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password or secrets.token_hex(8)!r}
c.Authenticator.allowed_users = {{{ALICE!r}, {BOB!r}}}
c.Spawner.cmd = [{str(venv / "jupyterhub-singleuser")!r}]
c.Spawner.default_url = "/lab"
# activity reported every 2 s (300 by default), our jobs' every second; no warm pools
# outliving the servers
c.Spawner.environment = {{"JUPYTERHUB_ACTIVITY_INTERVAL": "2",
                          "JUPYTER_DISTRAIN_ACTIVITY_SECONDS": "1",
                          "JUPYTER_DISTRAIN_POOL": "0"}}
c.Spawner.start_timeout = 90
c.JupyterHub.services = [{{"name": "test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [
    {{"name": "test", "services": ["test"],
      "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}},
]
if {cull_seconds}:
    c.JupyterHub.services.append(
        {{"name": "idle-culler", "command": {culler!r} + ["--cull-every=3"]}}
    )
    c.JupyterHub.load_roles.append(
        {{"name": "idle-culler", "services": ["idle-culler"],
          "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}}
    )
"""
    (base / "jupyterhub_config.py").write_text(config)
    env = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}"}
    with open(base / "hub.log", "wb") as log:
        hub = subprocess.Popen(
            [str(venv / "jupyterhub"), "-f", str(base / "jupyterhub_config.py")],
            cwd=base,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    made = Hub(f"http://127.0.0.1:{port}/", token)
    try:
        wait_for(lambda: made.api("GET", "hub/api/")[0] == 200 or hub.poll() is not None, 90,
                 what="the hub")  # fmt: skip
        assert hub.poll() is None, (base / "hub.log").read_text()[-3000:]
        yield made
    finally:
        for user in (ALICE, BOB):  # the hub stops the servers it spawned
            with contextlib.suppress(OSError):
                made.api("DELETE", f"hub/api/users/{user}/server")
        # its services (the idle culler) run in sessions of their own: ended here, first
        # (the hub waits for them), and whatever outlived the hub after it
        spawned = psutil.Process(hub.pid).children(recursive=True)
        for proc in spawned:
            with contextlib.suppress(psutil.Error):
                if "jupyterhub_idle_culler" in " ".join(proc.cmdline()):
                    proc.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hub.pid, signal.SIGTERM)
        try:
            hub.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait(10)
        for proc in spawned:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def main(argv: list[str]) -> int:
    """Run a hub on port ``argv[0]`` until SIGTERM (Playwright's webServer)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with tempfile.TemporaryDirectory(prefix="distrain-hub-") as base:
        password = os.environ["UI_TESTS_HUB_PASSWORD"]
        with jupyterhub(Path(base), int(argv[0]), password):
            print(f"hub on port {argv[0]}", flush=True)
            while not stop:
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
