"""The launchers' own flags (ssh hosts and options, a Ray address): defined once for
``%%distributed`` and ``bench``, with the :class:`~jupyter_distrain.contract.spec.JobSpec` field
each one sets."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.magic_arguments import ArgDecorator

# (flag, JobSpec field, add_argument keywords)
_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--hosts", "hosts", {"default": "", "help": "ssh launcher: host:slots,... or a hostfile"}),
    ("--ssh-port", "ssh_port", {"type": int, "default": 22, "help": "ssh launcher: the port"}),
    ("--ssh-user", "ssh_user", {"default": "", "help": "ssh launcher: the user on the hosts"}),
    (
        "--ssh-identity",
        "ssh_identity",
        {"default": "", "metavar": "FILE", "help": "ssh launcher: private key"},
    ),
    (
        "--ssh-known-hosts",
        "ssh_known_hosts",
        {"default": "", "metavar": "FILE", "help": "ssh launcher: known_hosts"},
    ),
    (
        "--ssh-accept-new-hosts",
        "ssh_accept_new_hosts",
        {
            "action": "store_true",
            "help": "ssh launcher: accept and record the key of a host seen for the first time",
        },
    ),
    (
        "--remote-python",
        "remote_python",
        {"default": "", "help": "ssh launcher: the interpreter on the hosts"},
    ),
    (
        "--network-interface",
        "network_interface",
        {"default": "", "help": "ssh launcher: the interface to use"},
    ),
    (
        "--address",
        "ray_address",
        {
            "default": "",
            "help": "ray launcher: the Ray cluster (host:port or ray://...; default a running "
            "one, else a local one)",
        },
    ),
]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_launcher_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """Add the launchers' flags to an argparse parser (or argument group)."""
    for flag, _, keywords in _FLAGS:
        parser.add_argument(flag, **keywords)


def launcher_options(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec fields the parsed launcher flags set."""
    return {field: getattr(args, _dest(flag)) for flag, field, _ in _FLAGS}


class launcher_arguments(ArgDecorator):  # noqa: N801 (named as IPython's `argument`)
    """``@launcher_arguments()``: the launchers' flags for a ``magic_arguments`` magic."""

    def add_to_parser(self, parser: Any, group: Any) -> None:
        add_launcher_arguments(group if group is not None else parser)
