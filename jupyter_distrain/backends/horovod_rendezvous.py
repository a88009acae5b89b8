"""Horovod's Gloo rendezvous as horovodrun would run it: the server (bound to one
address), the host list and each rank's environment. The plain and the elastic Horovod
runs both use it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..contract.launch import Slot
from .base import Services


def hosts_string(slots: list[Slot]) -> str:
    """Horovod's ``host:slots,...`` notation for the placed slots, in order."""
    counts = Counter(s.host for s in slots)
    return ",".join(f"{host}:{counts[host]}" for host in dict.fromkeys(s.host for s in slots))


def gloo_rank_env(slot: Slot, info: Any, address: str, port: int) -> dict[str, str]:
    """What horovodrun would give the process in ``slot`` with Horovod's ``SlotInfo``."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": slot.iface,
        "NCCL_SOCKET_IFNAME": slot.iface,
        "HOROVOD_HOSTNAME": info.hostname,
        "HOROVOD_RANK": str(info.rank),
        "HOROVOD_SIZE": str(info.size),
        "HOROVOD_LOCAL_RANK": str(info.local_rank),
        "HOROVOD_LOCAL_SIZE": str(info.local_size),
        "HOROVOD_CROSS_RANK": str(info.cross_rank),
        "HOROVOD_CROSS_SIZE": str(info.cross_size),
    }


def bound_rendezvous(address: str) -> Any:
    """Horovod's RendezvousServer, listening on ``address`` only (Horovod's own binds
    every interface, and its elastic handler unpickles what it is sent)."""
    from horovod.runner.http.http_server import (
        RendezvousHandler,
        RendezvousHTTPServer,
        RendezvousServer,
    )
    from horovod.runner.util.threads import in_thread

    class BoundRendezvousServer(RendezvousServer):
        def start(self, handler_cls: Any = RendezvousHandler) -> int:
            self._httpd = RendezvousHTTPServer((address, 0), handler_cls, self._verbose)
            self._listen_thread = in_thread(target=self._httpd.serve_forever)
            return self._httpd.server_address[1]

    return BoundRendezvousServer(verbose=0)


def rendezvous_ports(address: str, port: int) -> dict[str, list[int]]:
    """The rendezvous port, for the warning a job without isolation prints (on loopback,
    other users of this machine reach it)."""
    return {f"Horovod rendezvous (unauthenticated, {address})": [port]}


class RendezvousService(Services):
    """Horovod's rendezvous server, run in the supervisor for one Gloo job."""

    def __init__(self, plan: list[Any], address: str):
        self.server = bound_rendezvous(address)
        self.port = self.server.start()
        self.server.init(plan)

    def stop(self) -> None:
        self.server.stop()
