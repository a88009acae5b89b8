"""Bringing back what a job produced on its hosts, once it ends: each holder's archive
streamed into :class:`~..agent.delivery.Delivery` (which keeps only what a host may send),
all holders at once, and a holder's directory removed only once what came from it is
stored here. A transport says how to open a holder's archive and how to remove its
directory (an ssh session's stdout, a Slurm task's pieces through its step, a Ray actor's
chunks); what is kept, what is said and when a directory stays are decided here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..agent.delivery import Delivery, Received, one_line

AT_ONCE = 16  # holders read at the same time


@dataclass(frozen=True)
class Holder:
    """One place (a host, a Slurm task, a Ray slot) that holds a job's files."""

    source: str  # as warnings name it: "host h1", "task 0 on n1", "slot 0 on 10.0.0.2"
    directory: str  # the job's directory there, named when the files stay in it
    result: bool  # it holds rank 0's result
    open: Callable[[], AbstractContextManager[IO[bytes]]]  # its archive, as it streams
    remove: Callable[[], None]  # remove its directory there


def bring_back(job_path: Path, holders: Sequence[Holder], warn: Callable[[str], None]) -> None:
    """Bring back what ``holders`` hold into the job directory ``job_path``, all at once;
    each holder's directory is removed once its files are stored here, else it stays and
    the user is told where (``warn``)."""
    delivery = Delivery(job_path, warn)

    def one(holder: Holder) -> None:
        try:
            with holder.open() as stream:
                received = delivery.receive(holder.source, stream, holder.result)
        except Exception as exc:  # the host, task or actor is gone; no ssh could start
            received = Received(holder.source, problem=one_line(exc))
        if not received.complete:
            warn(
                f"{holder.source}: what the job produced there was not brought back "
                f"({received.problem}); it stays there in {holder.directory}"
            )
            return
        try:
            holder.remove()
        except Exception as exc:
            warn(
                f"{holder.source}: the job's directory there is left in {holder.directory} "
                f"(it could not be removed: {one_line(exc).removeprefix(holder.source + ': ')})"
            )

    with ThreadPoolExecutor(max_workers=max(1, min(AT_ONCE, len(holders)))) as pool:
        list(pool.map(one, holders))
