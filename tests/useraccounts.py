"""The ordinary accounts the user-facing tests run as (made by tests/users/accounts.sh,
as root, in `make test`): ALICE runs jobs, BOB is her neighbour on the same machine."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

ALICE, BOB = "distrain-alice", "distrain-bob"
USERS = Path(__file__).parent / "users"
REPO = USERS.parent.parent
# Debian's Python carries python3-seccomp (the venv's does not)
NO_NAMESPACES = ["/usr/bin/python3", str(USERS / "no_namespaces.py")]


def me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def as_user(user: str, argv: list[str], no_namespaces: bool = False) -> list[str]:
    """``argv`` run as ``user`` with a login's environment: as it is when the test runs as
    that account (the user battery), through tests/users/as_user.sh when it runs as root.
    ``no_namespaces``: where the kernel refuses new namespaces, as in a container."""
    argv = [*NO_NAMESPACES, *argv] if no_namespaces else argv
    if os.geteuid() == 0:
        return [str(USERS / "as_user.sh"), user, *argv]
    assert me() == user, f"this test runs as {user} or as root, not as {me()}"
    return argv


def run_as(
    user: str, argv: list[str], timeout: float = 180, **kwargs
) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (see :func:`as_user`); its output as text."""
    no_namespaces = kwargs.pop("no_namespaces", False)
    return subprocess.run(
        as_user(user, argv, no_namespaces),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@contextlib.contextmanager
def reachable_by(user: str, path: Path, mode: str = "r") -> Iterator[None]:
    """Let ``user`` reach ``path`` (as root): an ACL entry for that account alone on each
    folder above it it could not pass, and ``mode`` on ``path``; taken off at the end."""
    opened = [
        folder
        for folder in reversed(path.parents)
        if subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(folder)]).returncode
    ]
    try:
        for folder in opened:
            subprocess.run(["setfacl", "-m", f"u:{user}:x", str(folder)], check=True)
        subprocess.run(["setfacl", "-m", f"u:{user}:{mode}", str(path)], check=True)
        yield
    finally:
        for entry in [*opened, path]:
            subprocess.run(["setfacl", "-x", f"u:{user}", str(entry)], check=False)
