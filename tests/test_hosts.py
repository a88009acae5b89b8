"""``--hosts`` parsing and ssh error messages (no processes)."""

from __future__ import annotations

import pytest

from jupyter_distrain.contract.spec import JobSpec, SpecError
from jupyter_distrain.launchers.ssh.hosts import HostSlots, parse_hosts
from jupyter_distrain.launchers.ssh.session import SshOptions, explain


def test_hosts_from_the_flag_and_from_a_hostfile(tmp_path):
    assert parse_hosts("h1:2, h2,10.0.0.7:4") == [
        HostSlots("h1", 2),
        HostSlots("h2", 1),
        HostSlots("10.0.0.7", 4),
    ]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the lab\nh1 slots=2\n\nh2:3  # big one\nh3\n")
    assert parse_hosts(str(hostfile)) == [
        HostSlots("h1", 2),
        HostSlots("h2", 3),
        HostSlots("h3", 1),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--hosts is empty"),
        ("h1:0", "'h1:0': the slots must be a whole number 1-1024"),
        ("h1:x", "'h1:x': the slots must be"),
        ("-oProxyCommand=x:1", "'-oProxyCommand=x' is not a host name"),
        ("h1,h1:2", "--hosts names h1 more than once"),
        ("/no/such/hostfile", "cannot read the hostfile /no/such/hostfile"),
    ],
)
def test_bad_hosts_are_named(text, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_hosts(text)


def test_ssh_flags_are_checked():
    with pytest.raises(SpecError, match="--ssh-port must be a port number"):
        JobSpec(code="", launcher="ssh", hosts="h", ssh_port=0).validate()
    with pytest.raises(SpecError, match="--hosts is for a multi-host launcher"):
        JobSpec(code="", hosts="h1").validate()
    with pytest.raises(SpecError, match="--ssh-user: 'a b' is not a user name"):
        JobSpec(code="", launcher="ssh", hosts="h", ssh_user="a b").validate()


def test_ssh_failures_read_as_one_line_naming_the_host():
    options = SshOptions(port=2222, python="/opt/py/bin/python")
    said = "ssh: connect to host h2 port 2222: Connection refused\r\n"
    assert (
        explain("h2", 255, said, options)
        == "host h2: connect to host h2 port 2222: Connection refused"
    )
    said = (
        "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.\n"
    )
    assert "host h2: its host key has changed" in explain("h2", 255, said, options)
    said = "bash: line 1: /opt/py/bin/python: No such file or directory\n"
    assert explain("h2", 127, said, options) == (
        "host h2: no Python interpreter at /opt/py/bin/python (--remote-python)"
    )
    argv = options.ssh_argv("h2", ["python", "-c", "print('a b')"])
    assert (
        "StrictHostKeyChecking=yes" in argv and argv[-1] == "python -c 'print('\"'\"'a b'\"'\"')'"
    )
