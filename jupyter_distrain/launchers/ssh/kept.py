"""ssh connections kept between jobs, so that a re-run of a multi-host cell pays for no
handshake: one master connection per host and set of ssh options, in this user's
runtime directory, shared by the notebook's pre-flight and every job's supervisor. A
master ends ``JUPYTER_DISTRAIN_SSH_KEEP`` seconds (default 300; 0 keeps none: each job
opens and closes its own) after its last session ends, when its host stops answering
ssh's keepalives, or on ``%distributed pool --clear`` (once the sessions of running
jobs on it have ended).

Beside each master the pre-flight's findings for the host are remembered, valid while
that same master lives: a re-run on the same hosts with the same options and backend
checks nothing again (a restarted sshd or host, or another option, is a new master and
a new check). What must be fresh for each job (free ports, the sweep of what ended jobs
left) comes with the job's files (the agent's ``unpack``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ...contract.private import is_private_dir, runtime_dir, write_atomic
from ...contract.process import Env
from .connection import CONTROL_DIR_CHARS, SshOptions, on_each

log = logging.getLogger(__name__)

DEFAULT_KEEP_SECONDS = 300
PREFIX = "ssh-kept-"


def keep_seconds() -> int:
    """How long an unused master is kept (``JUPYTER_DISTRAIN_SSH_KEEP``; 0: none)."""
    try:
        return max(0, int(float(os.environ.get(Env.SSH_KEEP, DEFAULT_KEEP_SECONDS))))
    except ValueError:
        return DEFAULT_KEEP_SECONDS


def kept(options: SshOptions) -> SshOptions:
    """``options`` going through this user's kept masters; unchanged where none are kept
    (a keep of 0, or a runtime directory too deep for ssh's socket names)."""
    seconds = keep_seconds()
    if not seconds:
        return options
    described = json.dumps(options.described(), sort_keys=True)
    path = runtime_dir() / f"{PREFIX}{hashlib.sha256(described.encode()).hexdigest()[:10]}"
    if len(str(path)) > CONTROL_DIR_CHARS:
        return options
    path.mkdir(mode=0o700, exist_ok=True)
    if not is_private_dir(path):
        return options
    return dataclasses.replace(options, control_path=f"{path}/%C", keep=seconds)


def _record_path(options: SshOptions, host: str) -> Path:
    digest = hashlib.sha256(host.encode()).hexdigest()[:12]
    return Path(options.control_path).parent / f"{digest}.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def recall(options: SshOptions, host: str, key: str) -> dict[str, Any] | None:
    """What the pre-flight found on ``host`` for ``key`` (backend and interface), if it
    checked it over the master that runs now."""
    if not options.keep:
        return None
    record = _read(_record_path(options, host))
    if not record or record.get("host") != host:
        return None
    found = record.get("found", {}).get(key)
    if found is None or record.get("master") != options.master_pid(host):
        return None
    return found


def remember(options: SshOptions, host: str, key: str, found: dict[str, Any]) -> None:
    """Keep what the pre-flight found on ``host`` for ``key``, tied to its master."""
    if not options.keep:
        return
    pid = options.master_pid(host)
    if pid is None:
        return
    path = _record_path(options, host)
    record = _read(path)
    if record.get("master") != pid or record.get("host") != host:
        record = {"host": host, "options": options.described(), "master": pid}
    record.setdefault("found", {})[key] = found
    write_atomic(path, json.dumps(record))


@dataclasses.dataclass(frozen=True)
class KeptMaster:
    """A kept master connection, for ``%distributed pool``."""

    host: str
    pid: int
    options: SshOptions


def _recorded() -> list[tuple[str, SshOptions]]:
    """Every host with a record of a kept master, and the options that reach it."""
    found = []
    for record_path in sorted(runtime_dir().glob(f"{PREFIX}*/*.json")):
        record = _read(record_path)
        given = record.get("options")
        if not isinstance(given, dict) or not isinstance(record.get("host"), str):
            continue
        options = kept(SshOptions.from_described(given))
        if Path(options.control_path).parent == record_path.parent:
            found.append((record["host"], options))
    return found


def kept_masters() -> list[KeptMaster]:
    """The kept master connections running now."""
    recorded = _recorded()
    pids = on_each(recorded, lambda entry: entry[1].master_pid(entry[0]))
    return [
        KeptMaster(host, pid, options)
        for (host, options), pid in zip(recorded, pids, strict=True)
        if isinstance(pid, int)
    ]


def close_kept() -> list[str]:
    """Retire every kept master connection; the hosts they went to. One a running job's
    sessions go through (of any kernel of this user) lives on until that job ends:
    ending it would end the job's ranks on that host."""
    masters = kept_masters()
    on_each(masters, lambda master: master.options.retire_master(master.host))
    for master in masters:
        _record_path(master.options, master.host).unlink(missing_ok=True)
    return [m.host for m in masters]
