"""Per-process keys: what proves that a message about a process came from that process.

Every process of a job holds the job's secret (it signs the control channel), so a
request signed with it says only that its sender is one of the job's processes, or
holds the secret: a rank on any host. What a process says of itself and the supervisor
or the kernel acts on (its hello and pid, its stacks, a session cell's answer and its
result) must come from the process it names. The supervisor derives one key per process
from a master it never hands out (:class:`ProcessKeys`), gives each process its own in
its environment (``Env.KEY``; a helper that starts several, mpirun, gets its members'
in ``Env.KEYS``), and checks the ``proof`` of such messages under the key of the
process they name. A worker takes its key out of its environment first thing
(:func:`own_key`): the cell's subprocesses do not inherit it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable, MutableMapping
from typing import Any

from .process import Env, ProcessId

PROOF = "proof"  # the field of a message that holds its sender's proof


def _mac(key: str, body: dict[str, Any]) -> str:
    fields = {k: v for k, v in body.items() if k != PROOF}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()


def prove(key: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the proof that the holder of ``key`` sent it (unchanged without a key)."""
    return {**body, PROOF: _mac(key, body)} if key else body


class ProcessKeys:
    """The supervisor's keys: one per process, derived from a master kept in memory."""

    def __init__(self, master: bytes | None = None):
        self._master = master or secrets.token_bytes(32)

    def key(self, process: ProcessId) -> str:
        return hmac.new(self._master, str(process).encode(), hashlib.sha256).hexdigest()

    def env(self, process: ProcessId, members: Iterable[ProcessId] = ()) -> dict[str, str]:
        """What tells ``process`` its key; a helper's ``members`` get theirs through it."""
        hosted = {str(m): self.key(m) for m in members}
        if hosted:
            return {Env.KEYS: json.dumps(hosted)}
        return {Env.KEY: self.key(process)}

    def proven(self, process: ProcessId, body: dict[str, Any]) -> bool:
        """Whether ``body`` carries ``process``'s proof."""
        proof = body.get(PROOF)
        return isinstance(proof, str) and hmac.compare_digest(proof, _mac(self.key(process), body))


def own_key(me: ProcessId, environ: MutableMapping[str, str] | None = None) -> str:
    """This process's key, taken out of the environment ("" when it was given none)."""
    environ = os.environ if environ is None else environ
    key = environ.pop(Env.KEY, "")
    hosted = environ.pop(Env.KEYS, "")
    if hosted:
        try:
            key = str(json.loads(hosted).get(str(me), ""))
        except (ValueError, AttributeError):
            key = ""
    return key
