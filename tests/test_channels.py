"""The control and metrics channels under bad input: forged, stale, replayed, oversized,
malformed and flooding messages. Real sockets and a real ZeroMQ collector; no job."""

from __future__ import annotations

import errno
import json
import select
import socket
import threading
import time

import pytest
import zmq
from conftest import fault_row, wait_for

from jupyter_distrain.contract import control
from jupyter_distrain.contract.metrics import (
    HANDSHAKE_SECONDS,
    Collector,
    Reporter,
    connect_client,
    seal,
)


@pytest.fixture
def server(tmp_path):
    seen: list[dict] = []
    srv = control.ControlServer(
        "s3cret", lambda body: seen.append(body) or {"echo": body["op"]}, f"unix:{tmp_path}/c.sock"
    ).start()
    srv.seen = seen
    yield srv
    srv.stop()


def raw(server, data: bytes, timeout: float = 5) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(control.parse_address(server.address)[1])
        sock.sendall(data)
        return sock.recv(65536)


def test_signed_requests_are_answered_and_forgeries_refused(server, tmp_path):
    assert control.request(server.address, "s3cret", {"op": "ping"}) == {"ok": True, "echo": "ping"}
    reply = control.request(server.address, "wrong", {"op": "ping"})
    assert reply == {"ok": False, "error": "bad signature"} and server.rejected == 1
    line = control.encode("s3cret", {"op": "stop"})
    forged = json.loads(line)
    forged["body"]["op"] = "status"
    assert control.verify("s3cret", json.dumps(forged).encode()) is None
    assert (tmp_path / "c.sock").stat().st_mode & 0o777 == 0o600


def test_a_captured_request_cannot_be_replayed_or_reused_later(server):
    line = control.encode("s3cret", {"op": "stop"})
    assert json.loads(raw(server, line))["ok"] is True
    assert json.loads(raw(server, line)) == {"ok": False, "error": "bad signature"}
    assert [b["op"] for b in server.seen] == ["stop"]
    stale = json.loads(line)
    stale["time"] -= 3600
    stale["nonce"] = "fresh"
    payload = {k: stale[k] for k in ("body", "nonce", "time")}
    stale["sig"] = control.sign("s3cret", payload)  # signed, but an hour old
    assert json.loads(raw(server, json.dumps(stale).encode() + b"\n"))["ok"] is False


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1, 2]\n",
        b"[" * 50_000 + b"\n",  # nested past the parser's recursion limit
        json.dumps({"body": {}, "nonce": "n", "time": 0, "sig": "\u00e9" * 64}).encode() + b"\n",
        json.dumps({"body": [], "nonce": "n", "time": 0, "sig": "0" * 64}).encode() + b"\n",
    ],
)
def test_malformed_requests_get_one_short_refusal_and_the_server_goes_on(server, line):
    assert json.loads(raw(server, line)) == {"ok": False, "error": "bad signature"}
    assert control.request(server.address, "s3cret", {"op": "ping"})["ok"] is True


def test_an_endless_line_is_cut_and_a_silent_client_times_out(server, monkeypatch):
    reply = raw(server, b"x" * (control.MAX_LINE_BYTES + 10))
    assert b"request too long" in reply
    assert control.request(server.address, "s3cret", {"op": "ping"})["ok"] is True


def test_connections_over_the_cap_take_the_slots_of_unsigned_ones_not_queued(server):
    idle = []
    for _ in range(control.MAX_CONNECTIONS + 5):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(control.parse_address(server.address)[1])
        idle.append(sock)
    wait_for(lambda: server.dropped >= 5, 5, what="dropped")
    assert server.refused == 0
    # the oldest were dropped: closed from the server's side
    idle[0].settimeout(5)
    assert idle[0].recv(1) == b""
    assert control.request(server.address, "s3cret", {"op": "ping"})["ok"] is True
    for sock in idle:
        sock.close()


def test_collector_stores_fresh_signed_batches_and_counts_everything_else(tmp_path):
    seen = []
    collector = Collector("job-secret", tmp_path / "metrics.jsonl", seen.append).start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    connect_client(push, collector.address, "job-secret")
    good = b'{"role":"worker","index":0,"step":1}\n{"role":"worker","index":0,"step":2}\n'
    push.send_multipart(seal(b"job-secret", "a", 1, good))
    push.send_multipart(seal(b"job-secret", "a", 1, good))  # replayed
    forged = b'{"role":"worker","index":0,"step":99}\n'
    push.send_multipart(seal(b"another-secret", "a", 2, forged))
    push.send_multipart([forged])  # unsigned
    push.send_multipart(seal(b"job-secret", "b", 1, b'[1]\n"x"\n'))  # signed, not objects
    push.send_multipart([b"0" * (5 * 2**20)])  # over the size limit: dropped by ZeroMQ
    push.send_multipart(seal(b"job-secret", "a", 2, b'{"role":"worker","index":0,"step":3}\n'))
    wait_for(lambda: collector.records == 5, 5, what="delivery")
    assert collector.rejected == 3
    collector.stop()
    push.close()
    ctx.term()
    stored = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().split()]
    assert [r.get("step") for r in stored if isinstance(r, dict)] == [1, 2, 3]
    assert [r["step"] for r in seen] == [2, 3]


def test_reporter_never_raises_and_identity_cannot_be_overridden(tmp_path):
    import numpy as np

    collector = Collector("s", tmp_path / "m.jsonl", lambda r: None).start()
    reporter = Reporter(collector.address, "s", {"role": "worker", "index": 1})
    reporter.report({"step": np.int64(3), "loss": np.float32(0.5), "role": "ps", "index": 7})
    reporter.report({"step": 4, "weird": object(), "arr": np.ones(2)})
    reporter.close()
    wait_for(lambda: collector.records >= 2, 5, what="delivery")
    collector.stop()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().split("\n") if x]
    steps = [r for r in records if "step" in r]
    assert [(r["role"], r["index"], r["step"]) for r in steps] == [
        ("worker", 1, 3),
        ("worker", 1, 4),
    ]
    assert steps[0]["loss"] == 0.5 and isinstance(steps[1]["weird"], str)


def test_a_flood_of_forgeries_does_not_stop_real_requests(server):
    stop = time.monotonic() + 2
    sent = [0]

    def flood() -> None:
        while time.monotonic() < stop:
            try:
                raw(server, b"garbage\n" * 10, timeout=1)
                sent[0] += 1
            except OSError:
                pass

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    answered = 0
    while time.monotonic() < stop:
        try:
            answered += control.request(server.address, "s3cret", {"op": "ping"}, timeout=2)["ok"]
        except OSError:
            pass
    for t in threads:
        t.join()
    assert sent[0] > 10 and answered > 10


def test_clients_that_leave_before_the_answer_leave_no_traceback(server, capfd):
    for _ in range(50):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(control.parse_address(server.address)[1])
            sock.sendall(b"garbage\n" * 100)  # and go, without reading a reply
    time.sleep(0.5)
    assert control.request(server.address, "s3cret", {"op": "ping"})["ok"] is True
    assert "Traceback" not in capfd.readouterr().err


def _answered(address: str) -> bool:
    """Whether a ping is answered (a refused connection is reset or closed unanswered)."""
    try:
        return control.request(address, "s3cret", {"op": "ping"})["ok"]
    except (ConnectionResetError, BrokenPipeError):
        return False


class Drippers:
    """``count`` clients that each send one byte of a request every ``every`` seconds,
    never finishing it: the slow-client attack on the connection slots."""

    def __init__(self, address: str, count: int, every: float):
        self.socks = []
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(control.parse_address(address)[1])
            self.socks.append(sock)
        self.every = every
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self) -> None:
        while not self.done.wait(self.every):
            for sock in self.socks:
                try:
                    sock.send(b"{")
                except OSError:
                    pass

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()


def test_slow_clients_never_keep_the_jobs_own_requests_out(server, monkeypatch):
    drippers = Drippers(server.address, control.MAX_CONNECTIONS + 8, every=0.5)
    try:
        wait_for(lambda: server.dropped >= 8, 5, what="the cap reached")
        # every slot is held by a client sending a byte every 0.5 s: a signed request
        # still takes one at once, not after the request deadline
        for _ in range(5):
            assert _answered(server.address)
        assert server.refused == 0
    finally:
        drippers.close()


def _hold(address: str, sources: list[str], each: int) -> list[socket.socket]:
    """``each`` connections that never send a request, from every source address."""
    held = []
    for source in sources:
        for _ in range(each):
            sock = socket.create_connection(address, source_address=(source, 0))
            held.append(sock)
    return held


def test_one_tcp_peer_cannot_take_every_slot(tmp_path):
    srv = control.ControlServer("s3cret", lambda body: {}, "tcp:127.0.0.1:0").start()
    try:
        address = control.parse_address(srv.address)[1]
        held = _hold(address, ["127.0.0.1"], control.MAX_CONNECTIONS_PER_PEER + 4)
        # past its cap, the address's own oldest connections make room
        wait_for(lambda: srv.dropped >= 4, 5, what="the per-peer cap")
        assert srv.dropped == 4 and srv.refused == 0
        assert _answered(srv.address)
        for sock in held:
            sock.close()
    finally:
        srv.stop()


def test_a_burst_of_connections_is_queued_not_dropped(tmp_path):
    """100 connections at once (a 128-rank job's hellos arrive so) are all let in by
    the kernel straight away: at socketserver's listen backlog of 5, the ones past it
    were dropped and connected only when their SYN was sent again, a second later (a
    co-tenant's flood got in at 10 connections a second: the Slurm flood test's 32)."""
    srv = control.ControlServer("s3cret", lambda body: {}, "tcp:127.0.0.1:0").start()
    socks = [socket.socket() for _ in range(100)]
    try:
        address = control.parse_address(srv.address)[1]
        for sock in socks:
            sock.setblocking(False)
            assert sock.connect_ex(address) == errno.EINPROGRESS
        deadline = time.monotonic() + 0.9  # before the first SYN is sent again
        waiting = list(socks)
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], waiting, [], 0.05)
            waiting = [s for s in waiting if s not in writable]
        assert not waiting, f"{len(waiting)} of 100 connections not let in within 0.9 s"
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in socks)
    finally:
        for sock in socks:
            sock.close()
        srv.stop()


def test_a_request_already_sent_keeps_its_slot_against_newer_silent_connections(
    tmp_path, monkeypatch
):
    """The job's request has arrived but its thread has not read it yet (a loaded
    machine) when 8 silent connections from the same address come in: they push out
    each other, not the request; before, the oldest unsigned went, the request with it
    ('no reply'), and a flood of 700 connections a second could keep the kernel out."""
    read_line = control._read_line

    def slow_to_read(sock, pending):
        time.sleep(3.0)
        return read_line(sock, pending)

    monkeypatch.setattr(control, "_read_line", slow_to_read)
    srv = control.ControlServer("s3cret", lambda body: {"echo": body["op"]}, "tcp:127.0.0.1:0")
    srv.start()
    try:
        address = control.parse_address(srv.address)[1]
        kernel = socket.create_connection(address)
        kernel.sendall(control.encode("s3cret", {"op": "ping"}))
        time.sleep(0.2)  # accepted, its bytes waiting
        silent = _hold(address, ["127.0.0.1"], control.MAX_CONNECTIONS_PER_PEER + 2)
        wait_for(lambda: srv.dropped >= 3, 5, what="the per-peer cap")
        kernel.settimeout(5)
        assert json.loads(kernel.recv(65536)) == {"ok": True, "echo": "ping"}
        for sock in [kernel, *silent]:
            sock.close()
    finally:
        srv.stop()


def test_peers_from_a_few_addresses_cannot_hold_the_slots_against_the_job(tmp_path):
    """A co-tenant of a node binds connections from several loopback addresses (a
    host with an IPv6 prefix has millions): at the cap, a new connection takes the slot
    of an unsigned one, so the job's own requests are answered, and one connection of
    each address is never dropped for the others."""
    srv = control.ControlServer("s3cret", lambda body: {}, "tcp:127.0.0.1:0").start()
    try:
        address = control.parse_address(srv.address)[1]
        sources = [f"127.0.0.{i}" for i in range(2, 7)]  # 5 x 8 = 40 > 32 slots
        held = _hold(address, sources, control.MAX_CONNECTIONS_PER_PEER)
        wait_for(lambda: srv.dropped >= 8, 5, what="the cap reached")
        for _ in range(5):
            assert _answered(srv.address)
        assert srv.refused == 0
        for sock in held:
            sock.close()
    finally:
        srv.stop()


def test_at_the_cap_the_most_crowded_address_gives_up_a_slot_not_a_lone_one(tmp_path):
    # the victim's address was the greatest address, not the one holding the most slots:
    # a lone connection of the job (127.0.0.9 here) was dropped for a crowd's newcomer
    srv = control.ControlServer("s3cret", lambda body: {}, "tcp:127.0.0.1:0").start()
    try:
        address = control.parse_address(srv.address)[1]
        crowd = _hold(address, [f"127.0.0.{i}" for i in range(2, 5)], 8)  # 24
        crowd += _hold(address, ["127.0.0.5"], 7)  # 31
        (lone,) = _hold(address, ["127.0.0.9"], 1)  # 32: every slot held
        time.sleep(0.5)  # all accepted
        crowd += _hold(address, ["127.0.0.6"], 1)
        wait_for(lambda: srv.dropped >= 1, 5, what="a slot given up")
        lone.settimeout(0.5)
        with pytest.raises(socket.timeout):
            lone.recv(1)  # still open: not shut down by the server
        for sock in [*crowd, lone]:
            sock.close()
    finally:
        srv.stop()


def test_metrics_peers_without_the_secret_cannot_send_or_hold_connections(tmp_path):
    """Over TCP the collector is a CURVE server keyed by the job's secret: a sender with
    another secret delivers nothing, and 40 raw peers that never finish ZeroMQ's
    handshake are all disconnected after HANDSHAKE_SECONDS while the job's own sender
    goes on."""
    collector = Collector("job-secret", tmp_path / "m.jsonl", lambda r: None).start()
    address = collector.address
    assert address.startswith("tcp://127.0.0.1:")
    port = int(address.rsplit(":", 1)[1])
    ctx = zmq.Context()
    try:
        outsider = ctx.socket(zmq.PUSH)
        outsider.setsockopt(zmq.LINGER, 0)
        connect_client(outsider, address, "another-secret")
        outsider.send_multipart(seal(b"job-secret", "x", 1, b'{"step":99}\n'))  # signed, even
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        for sock in held:
            sock.sendall(b"\xff\x00")  # the first bytes of a greeting, then nothing
        started = time.monotonic()
        reporter = Reporter(address, "job-secret", {"role": "worker", "index": 0})
        reporter.report({"step": 1})
        reporter.flush()

        def steps() -> list[int]:
            lines = (tmp_path / "m.jsonl").read_text().split()
            return [r["step"] for r in map(json.loads, lines) if "step" in r]  # not heartbeats

        wait_for(lambda: steps() == [1], 5, what="the job's own record")

        def closed_after(sock: socket.socket) -> float:
            sock.settimeout(HANDSHAKE_SECONDS + 10)
            while sock.recv(4096):
                pass
            return time.monotonic() - started

        waited = [closed_after(sock) for sock in held]
        assert max(waited) < HANDSHAKE_SECONDS + 3, waited
        reporter.report({"step": 2})
        reporter.close()
        wait_for(lambda: steps() == [1, 2], 5, what="the job's next record")
        assert collector.rejected == 0  # the outsider's batch never got through the handshake
        fault_row("40 slow clients on the metrics channel (tcp)", True, "served", 0)
    finally:
        outsider.close()
        for sock in held:
            sock.close()
        collector.stop()
        ctx.term()


SLEEPER = """\
import time
print("up", flush=True)
time.sleep(600)
"""


def test_a_job_stops_while_slow_clients_hold_every_control_slot():
    from jupyter_distrain import JobSpec, submit

    job = submit(JobSpec(code=SLEEPER, workers=2, backend="plain", grace=2))
    wait_for(lambda: job.state == "running" or job.done, 60, what="running")
    pids = [p.pid for p in job.status().processes]
    drippers = Drippers(job.dir.read_control().address, control.MAX_CONNECTIONS + 8, every=1.0)
    try:
        time.sleep(0.5)  # every slot is held now
        assert job.stop(wait=True) == "stopped"
    finally:
        drippers.close()
    import psutil

    left = [p for p in pids if psutil.pid_exists(p)]
    fault_row("40 slow clients holding the control channel", not left, job.state, len(left))
    assert left == []


SKEWED_CLIENT = """\
import sys, time
real = time.time
time.time = lambda: real() - 300  # this host's clock is 5 minutes behind
from jupyter_distrain.contract import control
print(control.request(sys.argv[1], "s3cret", {"op": "hello"})["ok"])
print(control.request(sys.argv[1], "s3cret", {"op": "bye"})["ok"])
"""


def test_a_host_whose_clock_is_off_is_answered_and_told_so(server):
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-c", SKEWED_CLIENT, server.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.split() == ["True", "True"], ran.stderr
    assert "clock is 300 s behind the supervisor's" in ran.stderr
    assert ran.stderr.count("clock is") == 1  # said once: the next request is timed right
    assert [b["op"] for b in server.seen] == ["hello", "bye"]
    fault_row("a host's clock 300 s behind (hello, bye)", True, "answered", 0)
