"""The job's files on its ssh hosts: sent once per generation to each host it uses,
with the first session that starts there (the host's next sessions wait for them), or
in a round trip of their own where the ports or mpirun's ranks are wanted first; that
round trip also sweeps what this notebook's ended jobs left on the host and brings
back free ports for the job's servers."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ...contract.launch import Slot
from ...contract.store import JobDir
from ..agent.client import job_files_archive, live_job_ids, notebook_id
from .connection import RemoteError, SshOptions, agent_answer, on_each
from .preflight import RemoteHost

log = logging.getLogger(__name__)


def check_each(results: list[Any]) -> None:
    """Raise one error naming every host of ``results`` (from ``on_each``) that failed."""
    failures = [r for r in results if isinstance(r, RemoteError)]
    if failures:
        raise RuntimeError("; ".join(map(str, failures)))


class Carrier:
    """Which hosts have the job's files, which are to get them this generation, and the
    free ports each host sent back."""

    def __init__(self, job: JobDir, options: SshOptions, host: Callable[[str], RemoteHost]):
        self.job, self.options, self._host = job, options, host
        self.unpacked: set[str] = set()  # hosts that have the job's directory
        self._to_carry: set[str] = set()  # hosts whose files have not gone this generation
        self._carrying: set[str] = set()  # hosts whose files go with a session this generation
        self._free_ports: dict[str, list[int]] = {}

    def new_generation(self, names: list[str]) -> None:
        """The hosts ``names`` are to get this generation's files."""
        self._to_carry, self._carrying = set(names), set()

    def unpack_all(self, names: list[str]) -> None:
        """The job's files to the hosts ``names`` whose files have not gone this
        generation, each in a round trip of its own (their free ports come back)."""
        names = [n for n in names if n in self._to_carry]
        self._to_carry.difference_update(names)
        check_each(on_each(names, self._unpack))

    def reserve_ports(self, slots: list[Slot]) -> list[int]:
        """A free port on each slot's host, from what the host sent back."""
        self.unpack_all(list(dict.fromkeys(slot.host for slot in slots)))
        try:
            return [self._free_ports[slot.host].pop(0) for slot in slots]
        except (IndexError, KeyError):
            raise RuntimeError("the pre-flight reserved too few ports") from None

    def claims(self) -> dict[str, Any]:
        """What a host's sweep needs: this notebook's id and its jobs that still live."""
        root = self.job.path.parent
        return {"notebook": notebook_id(root), "live": [*live_job_ids(root), self.job.id]}

    def _unpack(self, name: str) -> None:
        """The job's files to ``name``, after the sweep of what this notebook's ended
        jobs left there; the host's free ports come back."""
        claims = self.claims()
        host = self._host(name)
        directory = host.directory(self.job.id)
        args = ["unpack", directory, "--owner", claims["notebook"], "--leftovers"]
        args += ["--address", host.address, "--ports", str(host.slots + 2)]
        files = job_files_archive(self.job.path)
        out = self.options.run(name, args, json.dumps(claims).encode() + b"\n" + files)
        answer = agent_answer(name, out)
        try:
            ports, removed = list(map(int, answer["ports"])), list(map(str, answer["removed"]))
        except (ValueError, KeyError, TypeError):
            raise RemoteError(f"host {name}: the agent answered {out[:200]!r}") from None
        if removed:
            log.info("host %s: removed what ended jobs left there: %s", name, ", ".join(removed))
        free = self._free_ports.setdefault(name, [])
        free.extend(p for p in ports if p not in free)
        self.unpacked.add(name)

    def files_for(self, name: str, request: dict[str, Any]) -> bytes:
        """The job's files when this session is the first of the generation on host
        ``name`` (announced in ``request``); the host's next sessions wait for them."""
        if name in self._carrying:
            request["wait_files"] = True
            return b""
        if name not in self._to_carry:  # unpacked already (ports, mpirun)
            return b""
        self._to_carry.discard(name)
        self._carrying.add(name)
        self.unpacked.add(name)
        files = job_files_archive(self.job.path)
        claims = self.claims()
        request["files"] = {"bytes": len(files), "owner": claims["notebook"], "claims": claims}
        return files
