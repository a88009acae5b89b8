"""JupyterHub for real (tests/hubserver.py: PyPI's jupyterhub, run as root, with
configurable-http-proxy from the npm registry, its LocalProcessSpawner starting each
test account's server as that account, and jupyterhub-idle-culler). Through the hub's URL, with her own
token, distrain-alice runs a ``%%distributed`` cell in a kernel of her server; her
neighbour's token reaches neither her server nor her jobs; while her job trains the
culler leaves her server alone and culls his idle one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from conftest import wait_for
from hubserver import PROXY, Hub, jupyterhub
from test_users import TRAINING, submit_as
from useraccounts import ALICE, BOB, REPO

pytestmark = pytest.mark.root  # a hub that spawns local users runs as root

CULL_SECONDS = 12  # the culler's idle timeout (it looks every 3 s)
ALLREDUCE_CELL = """%%distributed --workers 2 --backend torch
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.item(), "world", dist.get_world_size())
"""


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
    with jupyterhub(base, cull_seconds=CULL_SECONDS) as made:
        yield made


def test_a_cell_runs_through_the_hub_as_its_user_and_her_neighbour_cannot_see_it(hub: Hub):
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


def test_a_training_job_keeps_its_users_server_from_the_idle_culler(hub: Hub):
    started = submit_as(ALICE, code=TRAINING, detach=True)  # it runs until stopped
    try:
        hub.spawn(ALICE)  # with her job already running: active from its first look
        hub.spawn(BOB)
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
