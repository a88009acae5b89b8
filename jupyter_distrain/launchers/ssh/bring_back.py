"""Bringing back what a job produced on an ssh host, once it ends: the agent's ``send``
streamed into the notebook side's :class:`~..agent.delivery.Delivery`, then its
``remove`` (only once what came back is stored here)."""

from __future__ import annotations

import subprocess
import tempfile

from ..agent.client import HANG_UP_SECONDS
from ..agent.delivery import Delivery, PipeStream, Received
from .session import RemoteError, SshOptions, explain

FINISH_SECONDS = 30.0  # with nothing coming back from a host, its files stay there
FINISH_TOTAL_SECONDS = 3600.0  # the longest one host's files may take to come back


def bring_back(
    options: SshOptions, name: str, directory: str, delivery: Delivery, result_host: bool
) -> None:
    """Bring back what the job produced on ``name`` in ``directory`` (rank 0's result
    when ``result_host``, checkpoints: what :mod:`..agent.delivery` accepts), streamed;
    the job's directory there is removed only once that is stored here."""
    try:
        received = _receive(options, name, directory, delivery, result_host)
    except OSError as exc:  # no ssh to start (EAGAIN, EMFILE)
        received = Received(f"host {name}", problem=f"cannot run ssh: {exc}")
    if not received.complete:
        raise RemoteError(
            f"host {name}: what the job produced there was not brought back "
            f"({received.problem}); it stays there in {directory}"
        )
    options.run(name, ["remove", directory])


def _receive(
    options: SshOptions, name: str, directory: str, delivery: Delivery, result_host: bool
) -> Received:
    """The agent's ``send`` on ``name``, read into ``delivery`` as it comes."""
    argv = options.ssh_argv(name, options.agent("send", directory))
    with (
        tempfile.TemporaryFile() as errors,
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,
        ) as ssh,
    ):

        def ended() -> None:  # the archive's end: did the agent send all of it?
            code = ssh.wait(HANG_UP_SECONDS)
            if code != 0:
                errors.seek(0)
                said = explain(name, code, errors.read().decode(errors="replace"), options)
                raise RemoteError(said.removeprefix(f"host {name}: "))

        assert ssh.stdout is not None
        stream = PipeStream(ssh.stdout, FINISH_SECONDS, FINISH_TOTAL_SECONDS, ended)
        received = delivery.receive(f"host {name}", stream, result_host)
        if ssh.poll() is None:
            ssh.kill()
    return received
