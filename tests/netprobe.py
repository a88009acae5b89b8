"""Another "host" for port scans: a network namespace joined to this one by a veth pair
(10.231.0.0/30), a TCP probe run from inside it, and what a process listens on and sees."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

PROBE = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(0.5)\n"
    "sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)\n"
)


def port_open(namespace: str, address: str, port: int) -> bool:
    """Whether a TCP connect from ``namespace`` to ``address``:``port`` succeeds."""
    cmd = ["ip", "netns", "exec", namespace, "python3", "-c", PROBE, address, str(port)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


@contextlib.contextmanager
def other_host_namespace() -> Iterator[tuple[str, str]]:
    """Yields (the namespace, the address of this host as seen from there)."""
    ns = f"scan{os.getpid()}"
    host_if, peer_if = f"vh{os.getpid() % 10000}", f"vp{os.getpid() % 10000}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if],
        ["ip", "link", "set", peer_if, "netns", ns],
        ["ip", "addr", "add", "10.231.0.1/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", "10.231.0.2/30", "dev", peer_if],
        ["ip", "netns", "exec", ns, "ip", "link", "set", peer_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ns, "10.231.0.1"
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _decode(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (from /proc/net/tcp) or its 32-digit IPv6 form -> (ip, port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        ip = socket.inet_ntop(socket.AF_INET6, words)
    return ip, int(port, 16)


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on, read in its own network namespace
    (``/proc/<pid>/net``: psutil reads the caller's, which misses a private namespace)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, PermissionError):
        return []  # gone meanwhile
    inodes = set()
    for fd in names:
        with contextlib.suppress(OSError):  # (an fd closed meanwhile)
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    try:
        found = []
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                        found.append(_decode(fields[1]))
        return found
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []  # gone meanwhile


def network_namespace(pid: int) -> str:
    """The network namespace process ``pid`` is in (``net:[4026531840]``)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def interfaces_of(pid: int) -> list[str]:
    """The network interfaces process ``pid`` sees (from ``/proc/<pid>/net/dev``)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


FLOOD = """\
import resource, signal, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
def closed(sock):
    try:  # what the server sent (ZeroMQ's greeting) is read: its close comes after it
        while sock.recv(4096, socket.MSG_DONTWAIT):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
held, opened = [], 0
while not stopping:
    for sock in [s for s in held if closed(s)]:
        held.remove(sock)  # dropped by the server: connect again
        sock.close()
    while len(held) < count and not stopping:
        try:
            held.append(socket.create_connection((host, port), timeout=0.1))
            opened += 1
        except TimeoutError:
            continue  # a SYN the full listen queue dropped: send a new one, not in 1 s
        except OSError:
            break
    time.sleep(0.2)
print("opened", opened, flush=True)
"""


@contextlib.contextmanager
def flooding(address: str, count: int, seconds: float, processes: int = 4) -> Iterator[list[int]]:
    """While the block runs (and at least ``seconds``), hold ``count`` TCP connections to
    ``address`` (``tcp://host:port``) that never say a word, each one the server drops
    made again, from ``processes`` processes at once: a co-tenant driving a server out of
    file descriptors. A connect the full listen queue leaves unanswered for 0.1 s is made
    anew (the kernel would send its SYN again only after 1 s: against ZeroMQ's listener,
    whose queue fills every hundred or so connections, that held the flood near 100 a
    second, fewer than its 5 s handshake limit drops). The yielded list gets how many
    were opened in all."""
    host, port = address.removeprefix("tcp://").removeprefix("tcp:").rsplit(":", 1)
    each = str(-(-count // processes))
    argv = [sys.executable, "-c", FLOOD, host, port, each]
    until = time.monotonic() + seconds
    floods = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    opened: list[int] = []
    try:
        yield opened
    finally:
        # the floods hold their connections until told to stop: with a fixed lifetime they
        # let go before a slow machine had opened what the block waits for
        time.sleep(max(0.0, until - time.monotonic()))
        for proc in floods:
            proc.terminate()
        outs = [proc.communicate(timeout=60)[0] for proc in floods]
    opened.append(sum(int(out.split()[-1]) for out in outs))
