"""What a job produced on an ssh host, as :mod:`..remote.bring_back` brings it back: the
agent's ``send`` streamed from an ssh session, then its ``remove``."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from typing import IO

from ..agent.client import HANG_UP_SECONDS
from ..agent.delivery import PipeStream
from ..remote.bring_back import Holder
from .connection import RemoteError, SshOptions, explain

FINISH_SECONDS = 30.0  # with nothing coming back from a host, its files stay there
FINISH_TOTAL_SECONDS = 3600.0  # the longest one host's files may take to come back


def holder(options: SshOptions, name: str, directory: str, result: bool) -> Holder:
    """Host ``name``'s files of the job, in ``directory`` there (rank 0's result when
    ``result``)."""

    @contextlib.contextmanager
    def archive() -> Iterator[IO[bytes]]:
        argv = options.ssh_argv(name, options.agent("send", directory))
        with tempfile.TemporaryFile() as errors:
            try:
                ssh = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    start_new_session=True,
                )
            except OSError as exc:  # EAGAIN, EMFILE
                raise RemoteError(f"cannot run ssh: {exc}") from None

            def ended() -> None:  # the archive's end: did the agent send all of it?
                code = ssh.wait(HANG_UP_SECONDS)
                if code != 0:
                    errors.seek(0)
                    said = explain(name, code, errors.read().decode(errors="replace"), options)
                    raise RemoteError(said.removeprefix(f"host {name}: "))

            with ssh:
                assert ssh.stdout is not None
                try:
                    yield PipeStream(ssh.stdout, FINISH_SECONDS, FINISH_TOTAL_SECONDS, ended)
                finally:
                    if ssh.poll() is None:
                        ssh.kill()

    return Holder(
        f"host {name}", directory, result, archive, lambda: options.run(name, ["remove", directory])
    )
