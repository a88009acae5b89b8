"""Name lookups inside a job's private network namespace: an address's name is "none",
at once, instead of "try again later".

In the namespace the machine's name servers are out of reach, so a reverse lookup of
an address ``/etc/hosts`` does not list (``::1``, ``::ffff:127.0.0.1``) fails with
``EAI_AGAIN`` where outside it gets "no such name" and falls back to the address:
PyTorch's TCPStore then printed "[c10d] The hostname of the client socket cannot be
retrieved. err=-3" on every rank of every torch job. :func:`answer_reverse_lookups`
gives each name server of ``/etc/resolv.conf`` (IPv4) an address on the namespace's
loopback (a local route) and answers there, from a thread of the supervisor: a reverse (PTR) query
gets NXDOMAIN, so ``getnameinfo`` returns the numeric address as it does outside; any
other query gets SERVFAIL, so a forward lookup still fails as "temporary failure" (the
job cannot reach other hosts, which is what that says). Nothing leaves the namespace
and nothing outside it can reach the answerer.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import struct
import threading
from pathlib import Path

log = logging.getLogger(__name__)

DNS_PORT = 53
_PTR = 12
_NXDOMAIN, _SERVFAIL = 3, 2
# rtnetlink (linux/rtnetlink.h): a local route
_RTM_NEWROUTE = 24
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_RT_TABLE_LOCAL, _RTPROT_BOOT, _RT_SCOPE_HOST, _RTN_LOCAL = 255, 3, 254, 2
_RTA_DST, _RTA_OIF = 1, 4


def name_servers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The IPv4 name servers ``resolv_conf`` names, in its order."""
    found = []
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_address(words[1]).version == 4:
                        found.append(words[1])
    return found


def answer(query: bytes) -> bytes | None:
    """The answer to one DNS query: NXDOMAIN for a reverse lookup, SERVFAIL for anything
    else; None for what is not a query with one question."""
    if len(query) < 12:
        return None
    ident, flags, questions = struct.unpack("!HHH", query[:6])
    if flags & 0x8000 or questions != 1:  # a response, or not one question
        return None
    end = 12
    while end < len(query) and query[end] != 0:
        if query[end] & 0xC0:  # a compression pointer has no place in a question
            return None
        end += query[end] + 1
    if end + 5 > len(query):
        return None
    qtype = struct.unpack("!H", query[end + 1 : end + 3])[0]
    rcode = _NXDOMAIN if qtype == _PTR else _SERVFAIL
    reply_flags = 0x8000 | (flags & 0x7900) | 0x0080 | rcode  # QR, opcode and RD kept, RA
    return struct.pack("!HHHHHH", ident, reply_flags, 1, 0, 0, 0) + query[12 : end + 5]


def _make_local(address: str) -> None:
    """Make ``address`` one of the namespace's own, through a local route on loopback
    (``ip route add local ADDRESS/32 dev lo table local``): an address given to an
    interface instead shows in every interface list, and OpenMPI, seeing an address
    beside 127.0.0.1, no longer took loopback for its own traffic and found none."""
    message = struct.pack(
        "=BBBBBBBBI",
        socket.AF_INET,
        32,
        0,
        0,
        _RT_TABLE_LOCAL,
        _RTPROT_BOOT,
        _RT_SCOPE_HOST,
        _RTN_LOCAL,
        0,
    )
    message += _attribute(_RTA_DST, socket.inet_aton(address))
    message += _attribute(_RTA_OIF, struct.pack("=I", socket.if_nametoindex("lo")))
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
    header = struct.pack("=IHHII", 16 + len(message), _RTM_NEWROUTE, flags, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.send(header + message)
        reply = sock.recv(4096)
    error = struct.unpack("=i", reply[16:20])[0] if len(reply) >= 20 else 0
    if error:
        raise OSError(-error, os.strerror(-error))


def _attribute(kind: int, data: bytes) -> bytes:
    """A netlink route attribute, padded to 4 bytes."""
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            query, peer = sock.recvfrom(4096)
        except OSError:
            return
        reply = answer(query)
        if reply is not None:
            with contextlib.suppress(OSError):
                sock.sendto(reply, peer)


def answer_reverse_lookups() -> list[str]:
    """In a private network namespace (call it there, once): answer on each IPv4 name
    server's address, in a daemon thread; returns those addresses (none taken: logged)."""
    served = []
    for address in name_servers():
        try:
            if not ipaddress.ip_address(address).is_loopback:
                _make_local(address)
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((address, DNS_PORT))
        except OSError as exc:
            log.info("no answers to name lookups on %s in the namespace: %s", address, exc)
            continue
        threading.Thread(target=_serve, args=(sock,), name="lookups", daemon=True).start()
        served.append(address)
    return served
