"""``--hosts`` parsing, ssh error messages and the launchers' options (no processes)."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain import plugins
from jupyter_distrain.client import api, cml
from jupyter_distrain.client.magics import DistributedMagics, checked_spec
from jupyter_distrain.contract.spec import JobSpec, SpecError
from jupyter_distrain.launchers.ssh.connection import SshOptions, explain
from jupyter_distrain.launchers.ssh.hosts import HostSlots, parse_hosts
from jupyter_distrain.launchers.ssh.launcher import SshLauncher


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
        ("h1\n:2", r"'h1\\n' is not a host name"),
        ("h1,h1:2", "--hosts names h1 more than once"),
        ("/no/such/hostfile", "cannot read the hostfile /no/such/hostfile"),
    ],
)
def test_bad_hosts_are_named(text, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_hosts(text)


def test_ssh_flags_are_checked():
    with pytest.raises(SpecError, match="--ssh-port must be a port number"):
        plugins.check_launcher_options(JobSpec(code="", launcher="ssh", hosts="h", ssh_port=0))
    with pytest.raises(SpecError, match="--hosts is for a multi-host launcher"):
        plugins.check_launcher_options(JobSpec(code="", hosts="h1"))
    with pytest.raises(SpecError, match="--ssh-user: 'a b' is not a user name"):
        plugins.check_launcher_options(JobSpec(code="", launcher="ssh", hosts="h", ssh_user="a b"))
    with pytest.raises(SpecError, match=r"--ssh-user: 'root\\n' is not a user name"):
        plugins.check_launcher_options(
            JobSpec(code="", launcher="ssh", hosts="h", ssh_user="root\n")
        )


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


def test_the_ssh_and_ray_options_are_carried_as_the_launchers_own(monkeypatch):
    submitted = []

    def submit(checked, user_ns=None):
        submitted.append(checked.spec)
        raise InterruptedError  # far enough: nothing is started

    monkeypatch.setattr(api, "submit", submit)
    magics = DistributedMagics(InteractiveShell.instance())
    for line in (
        "--launcher ssh --hosts h1:2 --ssh-port 2222 --ssh-accept-new",
        "--launcher ray --address 10.0.0.1:6379",
    ):
        with pytest.raises(InterruptedError):
            magics._start(checked_spec(line, "pass\n")[0])
    ssh, ray = submitted
    assert ssh.launcher_options == {"hosts": "h1:2", "ssh_port": 2222, "ssh_accept_new_hosts": True}
    assert ray.launcher_options == {"ray_address": "10.0.0.1:6379"}
    given = SshLauncher.kind.option_values(ssh)
    assert (given["ssh_port"], given["ssh_user"], given["remote_python"]) == (2222, "", "")
    # the Python API's keywords, as before the options moved
    spec = JobSpec(code="", launcher="ssh", hosts="h1:2", ssh_port=2222, ssh_user="")
    assert spec.launcher_options == {"hosts": "h1:2", "ssh_port": 2222, "ssh_user": ""}
    # checked by the launchers declaring them (the contract knows none): defaults left out
    checked = plugins.check_launcher_options(spec)
    assert checked.launcher_options == {"hosts": "h1:2", "ssh_port": 2222}
    assert cml._spec(code="", launcher="ssh", hosts="h:1").launcher_options == {"hosts": "h:1"}
    for unknown in (JobSpec(code="", hostz="h1"), JobSpec(code="", launcher_options={"hostz": 1})):
        with pytest.raises(SpecError, match="'hostz' is not an option of any launcher"):
            plugins.check_launcher_options(unknown)


def test_a_misspelt_launcher_option_is_refused_at_submit_with_nothing_started(jobs_root):
    with pytest.raises(SpecError, match="'hostz' is not an option of any launcher"):
        api.submit(JobSpec(code="pass", launcher="ssh", hostz="h1"))
    assert not any(jobs_root.iterdir())


ELASTIC_CELL = "import horovod.tensorflow as hvd\n\n@hvd.elastic.run\ndef train(state):\n    pass\n"


@pytest.mark.parametrize(
    "launcher, given, refusal",
    [
        (
            "ssh",
            {"backend": "horovod", "code": ELASTIC_CELL},
            "Horovod elastic is not supported "
            "by --launcher ssh yet: its rendezvous server would take",
        ),
        (
            "slurm",
            {"backend": "horovod", "code": ELASTIC_CELL},
            "Horovod elastic is not supported by --launcher slurm yet$",
        ),
        (
            "slurm",
            {"backend": "mpi"},
            r"--backend mpi is not supported by --launcher slurm yet \(use Gloo\)",
        ),
        (
            "slurm",
            {"backend": "horovod", "controller": "mpi"},
            "--controller mpi is not supported by --launcher slurm",
        ),
        (
            "ray",
            {"backend": "horovod", "controller": "mpi"},
            r"--controller mpi is not supported by --launcher ray \(no mpirun",
        ),
        ("ray", {"backend": "tf", "gpus": 1}, "--gpus is not supported by --launcher ray yet$"),
        ("ssh", {"backend": "tf", "gpus": 1}, "--gpus is not supported by --launcher ssh yet$"),
    ],
)
def test_what_a_backend_needs_and_a_launcher_lacks_is_one_line_with_nothing_started(
    jobs_root, launcher, given, refusal
):
    """The backend's needs meet the launcher's capabilities once, before any host is asked
    (no hosts, cluster or allocation is given here: a pre-flight would say so instead)."""
    spec = JobSpec(**{"code": "pass", "workers": 2, "launcher": launcher, **given})
    with pytest.raises(SpecError, match="^" + refusal):
        api.submit(spec)
    assert not any(jobs_root.iterdir())


def test_a_spec_with_launcher_options_round_trips_and_unknown_names_are_left_out():
    spec = JobSpec(code="pass", launcher="ssh", hosts="h1:2", ssh_user="deploy")
    assert spec.launcher_options == {"hosts": "h1:2", "ssh_user": "deploy"}
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert JobSpec.from_dict({**spec.to_dict(), "gone": 1}) == spec


def test_ssh_never_forwards_the_agent_or_x11():
    options = SshOptions(port=2222, control_path="/tmp/masters/%C")
    for argv in (options.ssh_argv("h2", ["true"]), ["ssh", *options.rsh_options()]):
        assert argv[:3] == ["ssh", "-a", "-x"], argv  # first: ssh keeps the first value given


def test_a_launcher_that_cannot_be_imported_leaves_the_others_options(monkeypatch):
    load = plugins.load_plugin

    def load_but_ray(group, name):
        if name == "ray":
            raise ImportError("a half-installed plugin")
        return load(group, name)

    monkeypatch.setattr(plugins, "load_plugin", load_but_ray)
    plugins.launcher_options.cache_clear()
    try:
        assert "ray_address" not in plugins.launcher_options()
        spec = plugins.check_launcher_options(JobSpec(code="", launcher="ssh", hosts="h1:2"))
        assert spec.launcher_options == {"hosts": "h1:2"}
    finally:
        plugins.launcher_options.cache_clear()
