"""The warm pools on ssh hosts, for ``%distributed pool``: which hosts the notebook's
jobs started a pool on (and how to reach them) is kept in ``ssh-hosts.json`` in the
local pools' directory; listing or clearing asks each host's agent (``pools``)."""

from __future__ import annotations

import dataclasses
import fcntl
import json
from pathlib import Path
from typing import Any

from ...contract.store import write_atomic
from ...pool.client import PoolInfo, pools_dir
from .kept import kept
from .session import RemoteError, SshOptions, on_each

HOSTS_FILE = "ssh-hosts.json"
ASK_SECONDS = 20.0


def remember(host: str, options: SshOptions) -> None:
    """Note that ``host`` (reached with ``options``) may have a pool of ours."""
    base = pools_dir(create=True)
    entry = dataclasses.asdict(dataclasses.replace(options, control_path="", keep=0))
    with open(base / (HOSTS_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hosts = _read(base)
        if hosts.get(host) != entry:
            hosts[host] = entry
            write_atomic(base / HOSTS_FILE, json.dumps(hosts, indent=1))


def _read(base: Path) -> dict[str, dict[str, Any]]:
    try:
        hosts = json.loads((base / HOSTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return hosts if isinstance(hosts, dict) else {}


def host_pools(drain: bool = False, root: Path | None = None) -> dict[str, list[PoolInfo] | str]:
    """Each remembered host's pools (after asking them to end their idle processes, with
    ``drain``), or why the host could not be asked."""
    hosts = _read(pools_dir(root))
    names = sorted(hosts)

    def ask(name: str) -> list[PoolInfo]:
        fields = {f.name for f in dataclasses.fields(SshOptions)}
        options = kept(SshOptions(**{k: v for k, v in hosts[name].items() if k in fields}))
        out = options.run(name, ["pools", *(["--drain"] if drain else [])], timeout=ASK_SECONDS)
        try:
            rows = json.loads(out.decode().strip().splitlines()[-1])
            return [PoolInfo(**row) for row in rows]
        except (ValueError, IndexError, TypeError):
            raise RemoteError(f"host {name}: the agent answered {out[:200]!r}") from None

    answers = on_each(names, ask)
    return {
        name: str(answer) if isinstance(answer, RemoteError) else answer
        for name, answer in zip(names, answers, strict=True)
    }
