"""JupyterHub for real: the hub (PyPI's jupyterhub, run as root as a hub that spawns
local users is) with configurable-http-proxy from the npm registry, its
LocalProcessSpawner starting each user's server from this checkout's virtualenv as that
user, and jupyterhub-idle-culler as a hub service. Through the hub's URL, with her own
token, distrain-alice runs a ``%%distributed`` cell in a kernel of her server; her
neighbour's token reaches neither her server nor her jobs; while her job trains the
culler leaves her server alone and culls his idle one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import wait_for
from test_users import TRAINING, submit_as
from useraccounts import ALICE, BOB, REPO

pytestmark = pytest.mark.root  # a hub that spawns local users runs as root

PROXY = REPO / "tests" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
CULL_SECONDS = 12  # the culler's idle timeout (it looks every 3 s)
ALLREDUCE_CELL = """%%distributed --workers 2 --backend torch
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.item(), "world", dist.get_world_size())
"""


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
def jupyterhub(base: Path) -> Iterator[Hub]:
    """The hub, its proxy and the culler, in ``base``; everything stopped at the end."""
    port, token = free_port(), secrets.token_hex(32)
    venv = Path(sys.executable).parent
    config = f"""
c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{free_port()}/"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.db_url = "sqlite:///{base}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{base}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {secrets.token_hex(8)!r}
c.Authenticator.allowed_users = {{{ALICE!r}, {BOB!r}}}
c.Spawner.cmd = [{str(venv / "jupyterhub-singleuser")!r}]
c.Spawner.environment = {{"JUPYTERHUB_ACTIVITY_INTERVAL": "2",
                          "JUPYTER_DISTRAIN_ACTIVITY_SECONDS": "1"}}
c.Spawner.start_timeout = 90
c.JupyterHub.services = [
    {{"name": "test", "api_token": {token!r}}},
    {{"name": "idle-culler", "command": [{sys.executable!r}, "-m", "jupyterhub_idle_culler",
                                        "--timeout={CULL_SECONDS}", "--cull-every=3"]}},
]
c.JupyterHub.load_roles = [
    {{"name": "test", "services": ["test"],
      "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}},
    {{"name": "idle-culler", "services": ["idle-culler"],
      "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}},
]
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
        os.killpg(hub.pid, signal.SIGTERM)
        try:
            hub.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait(10)


async def _execute(url: str, token: str, cells: list[str], timeout: float) -> list[str]:
    """Run ``cells`` one after the other in a new kernel of the server at ``url`` (its
    base, ending in /), over Jupyter's websocket; what each printed (streams, errors)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    def rest(method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"token {token}"}
        request = urllib.request.Request(url + path, data, headers, method=method)
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    kernel = rest("POST", "api/kernels", {"name": "python3"})
    ws_url = url.replace("http://", "ws://") + f"api/kernels/{kernel['id']}/channels"
    connection = await websocket_connect(
        HTTPRequest(ws_url, headers={"Authorization": f"token {token}"})
    )
    session, outputs = uuid.uuid4().hex, []
    deadline = time.monotonic() + timeout
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                      "session": session, "version": "5.3", "date": ""}  # fmt: skip
            content = {"code": code, "silent": False, "store_history": False,
                       "allow_stdin": False}  # fmt: skip
            message = {"header": header, "parent_header": {}, "metadata": {},
                       "content": content, "channel": "shell", "buffers": []}  # fmt: skip
            await connection.write_message(json.dumps(message))
            said: list[str] = []
            while True:
                left = deadline - time.monotonic()
                raw = await asyncio.wait_for(connection.read_message(), max(left, 0.1))
                if raw is None:
                    break
                reply = json.loads(raw)
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, body = reply["msg_type"], reply["content"]
                if kind == "stream":
                    said.append(body["text"])
                elif kind == "error":
                    said.append("\n".join(body["traceback"]))
                elif kind == "status" and body["execution_state"] == "idle":
                    break
            outputs.append("".join(said))
    finally:
        connection.close()
        rest("DELETE", f"api/kernels/{kernel['id']}")
    return outputs


def execute(url: str, token: str, cells: list[str], timeout: float = 180) -> list[str]:
    """:func:`_execute` from synchronous code."""
    return asyncio.run(_execute(url, token, cells, timeout))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    assert PROXY.exists(), "configurable-http-proxy is missing: make test installs it (tests/hub)"
    base = tmp_path_factory.mktemp("hub")
    base.chmod(0o755)
    with jupyterhub(base) as made:
        yield made


def test_a_cell_runs_through_the_hub_as_its_user_and_her_neighbour_cannot_see_it(hub):
    alice = hub.spawn(ALICE)
    mine = f"{hub.url}user/{ALICE}/"
    whoami = "import getpass; print(getpass.getuser())"
    _, said, whoami = execute(mine, alice, ["%load_ext jupyter_distrain", ALLREDUCE_CELL, whoami])
    assert said.count("sum 3.0 world 2") == 2, said
    status, listed = hub.api("GET", f"user/{ALICE}/distrain/jobs", token=alice)
    assert status == 200 and len(listed["jobs"]) >= 1, (status, listed)
    job = listed["jobs"][0]
    assert job["state"] == "succeeded"
    assert whoami.strip() == ALICE  # her server and kernels run as her, not as the hub
    # his token reaches neither her server's routes nor her job; his own server lists none
    bob = hub.spawn(BOB)
    for method, path in (("GET", "distrain/jobs"), ("GET", f"distrain/jobs/{job['id']}"),
                         ("DELETE", f"distrain/jobs/{job['id']}")):  # fmt: skip
        status, _ = hub.api(method, f"user/{ALICE}/{path}", token=bob)
        assert status == 403, (method, path, status)
    status, his = hub.api("GET", f"user/{BOB}/distrain/jobs", token=bob)
    assert status == 200 and his["jobs"] == [], his


def test_a_training_job_keeps_its_users_server_from_the_idle_culler(hub):
    hub.spawn(ALICE)
    hub.spawn(BOB)
    started = submit_as(ALICE, code=TRAINING, detach=True)  # it runs until stopped
    try:
        # nobody touches either server: the culler ends his after CULL_SECONDS idle
        wait_for(lambda: hub.server(BOB) is None, CULL_SECONDS * 4, what="his server culled")
        time.sleep(CULL_SECONDS + 6)  # hers, as idle but for the job, outlives his by that
        assert hub.server(ALICE) is not None  # her job's activity kept it
    finally:
        subprocess.run(
            [str(REPO / "tests" / "users" / "as_user.sh"), ALICE, sys.executable, "-m",
             "jupyter_distrain.cli", "stop", started["id"]], capture_output=True, timeout=60,
        )  # fmt: skip
    # once it has stopped hers goes idle too, and is culled
    wait_for(lambda: hub.server(ALICE) is None, CULL_SECONDS * 4, what="her server culled")
