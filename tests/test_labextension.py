"""The JupyterLab extension's "Distribute cell..." form refuses a bad value with the
magic's own message: the cases its Jest tests check (labextension/src/__tests__/
validation-cases.json) are checked here against the magic itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain.client import api
from jupyter_distrain.client.magics import DistributedMagics

CASES = Path(__file__).parent.parent / "labextension/src/__tests__/validation-cases.json"


class Submitted(Exception):
    """The line passed every check: the job would be submitted."""


@pytest.fixture
def magics(monkeypatch):
    def submit(spec, user_ns=None):
        raise Submitted

    monkeypatch.setattr(api, "submit", submit)
    return DistributedMagics(InteractiveShell.instance())


@pytest.mark.parametrize(("line", "message"), json.loads(CASES.read_text())["cases"])
def test_the_form_gives_the_magics_message(magics, line, message):
    with pytest.raises(Submitted if message is None else UsageError) as raised:
        magics._start(line, "pass\n")
    if message is not None:
        assert str(raised.value) == message
