"""Run a command where the kernel refuses new namespaces, as a container's seccomp
profile does (Docker's default, most JupyterHub-on-Kubernetes pods): ``unshare``,
``setns`` and a ``clone`` asking for a new namespace fail with EPERM, ``clone3`` with
ENOSYS (so the C library falls back to ``clone``). The filter is inherited by every
process the command starts.

Run with Debian's Python, which has ``python3-seccomp``::

    /usr/bin/python3 tests/users/no_namespaces.py COMMAND [ARG...]
"""

from __future__ import annotations

import errno
import os
import sys

import seccomp

NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)


def refuse_namespaces() -> None:
    """Install the filter on this process (and so on all it starts)."""
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "unshare")
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "setns")
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in range(17, 31):
        bit = 1 << flag
        if NAMESPACE_FLAGS & bit:
            rules.add_rule(
                seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit)
            )
    rules.load()


if __name__ == "__main__":
    refuse_namespaces()
    os.execvp(sys.argv[1], sys.argv[1:])
