"""What a job's process is handed in memory rather than in files of its job directory:
the job's secret and the values pushed from the notebook (``--push``).

On a Ray node every job of the cluster runs as the cluster's one OS user, so a file in
a slot's directory, private as it is, can be read by another job's task. There the
launcher sends these to the slot's actor in the call that starts the process, the
host agent writes them into an anonymous memory file (``memfd``, never on a disk) that
the process inherits, and :data:`Env.HANDOFF_FD <.process.Env.HANDOFF_FD>` names its
descriptor. The process reads it once, first thing, closes it and forgets the name (a
subprocess of the cell inherits neither). Elsewhere the job directory's ``control``
and ``push.pkl`` files carry the same.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Handoff:
    """The secret and the pickled pushed values (``b""``: nothing pushed)."""

    secret: str
    pushed: bytes = b""

    def fields(self) -> dict[str, str]:
        """As JSON fields (what goes into a request)."""
        return {"secret": self.secret, "pushed": base64.b64encode(self.pushed).decode()}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Handoff:
        return cls(str(fields["secret"]), base64.b64decode(fields.get("pushed", "")))


def memory_file(fields: dict[str, Any]) -> int:
    """An inheritable memfd holding ``fields`` (a :meth:`Handoff.fields`), read from its
    start; the caller passes it to the process and closes it."""
    fd = os.memfd_create("jupyter_distrain-handoff", 0)  # no MFD_CLOEXEC: it is inherited
    with os.fdopen(os.dup(fd), "w") as f:
        json.dump(fields, f)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


_received: list[Handoff | None] = []


def received(variable: str) -> Handoff | None:
    """What this process was handed (None: nothing, read the job directory instead), the
    descriptor named by environment ``variable`` (``Env.HANDOFF_FD``: this module is the
    lower of the two). The first call reads and closes the descriptor; later ones return
    the same."""
    if _received:
        return _received[0]
    name = os.environ.pop(variable, None)
    handed = None
    if name is not None:
        with os.fdopen(int(name), "r") as f:
            handed = Handoff.from_fields(json.load(f))
    _received.append(handed)
    return handed
