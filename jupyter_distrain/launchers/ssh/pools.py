"""The warm pools on ssh hosts, for ``%distributed pool``: which hosts the notebook's
jobs started a pool on (and how to reach them) is kept in ``ssh-hosts.json`` in the
local pools' directory; listing or clearing asks each host's agent (``pools``)."""

from __future__ import annotations

from pathlib import Path

from ...pool import places
from ...pool.client import PoolInfo
from .connection import RemoteError, SshOptions, agent_answer, on_each
from .kept import kept

HOSTS_FILE = "ssh-hosts.json"
ASK_SECONDS = 20.0


def remember(host: str, options: SshOptions) -> None:
    """Note that ``host`` (reached with ``options``) may have a pool of ours."""
    places.remember(HOSTS_FILE, host, options.described())


def host_pools(drain: bool = False, root: Path | None = None) -> dict[str, list[PoolInfo] | str]:
    """Each remembered host's pools (after asking them to end their idle processes, with
    ``drain``), or why the host could not be asked."""
    hosts = places.remembered(HOSTS_FILE, root)
    names = sorted(hosts)

    def ask(name: str) -> list[PoolInfo]:
        options = kept(SshOptions.from_described(hosts[name]))
        out = options.run(name, ["pools", *(["--drain"] if drain else [])], timeout=ASK_SECONDS)
        rows = agent_answer(name, out)
        try:
            return [PoolInfo(**row) for row in rows]
        except TypeError:
            raise RemoteError(f"host {name}: the agent answered {out[:200]!r}") from None

    answers = on_each(names, ask)
    return {
        name: str(answer) if isinstance(answer, RemoteError) else answer
        for name, answer in zip(names, answers, strict=True)
    }
