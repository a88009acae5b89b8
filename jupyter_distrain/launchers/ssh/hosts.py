"""``--hosts``: the hosts a multi-host job runs on, with their slots."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...contract.spec import SpecError

_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # fullmatch()ed
MAX_SLOTS = 1024


@dataclass(frozen=True)
class HostSlots:
    """One host named on ``--hosts`` and how many processes it may run."""

    name: str
    slots: int


def parse_hosts(text: str) -> list[HostSlots]:
    """``"h1:2,h2:2"`` (a missing count means 1), or the path of a hostfile with one
    ``host slots=N`` or ``host:N`` per line (``#`` comments). Raises :class:`SpecError`
    naming the bad entry."""
    text = text.strip()
    if not text:
        raise SpecError("--hosts is empty: name at least one host (host:slots,...)")
    path = Path(text).expanduser()
    if "/" in text or path.is_file():
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise SpecError(f"--hosts: cannot read the hostfile {text}: {exc.strerror}") from None
        entries = [line.split("#", 1)[0].strip() for line in lines]
        entries = [re.sub(r"\s+slots\s*=\s*", ":", e) for e in entries if e]
    else:
        entries = [e.strip() for e in text.split(",") if e.strip()]
    hosts = [_host(entry) for entry in entries]
    if not hosts:
        raise SpecError(f"--hosts: no host in {text!r}")
    names = [h.name for h in hosts]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SpecError(f"--hosts names {', '.join(repeated)} more than once")
    return hosts


def _host(entry: str) -> HostSlots:
    name, sep, count = entry.partition(":")
    if not _HOST_RE.fullmatch(name):
        raise SpecError(f"--hosts: {name!r} is not a host name or IPv4 address")
    if not sep:
        return HostSlots(name, 1)
    if not count.isdigit() or not 1 <= int(count) <= MAX_SLOTS:
        raise SpecError(f"--hosts: {entry!r}: the slots must be a whole number 1-{MAX_SLOTS}")
    return HostSlots(name, int(count))
