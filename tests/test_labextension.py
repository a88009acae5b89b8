"""The JupyterLab extension's "Distribute cell..." form takes its flags from the server
(``GET /distrain/flags``: the flag table) and asks the server whether the magic would
take a line (``POST /distrain/flags/check``), which answers in the magic's own words:
the cases of labextension/src/__tests__/validation-cases.json are checked here against
the magic and against that check; the flag table the Jest tests use (flags.json) is the
server's, so the two cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic_arguments import parse_argstring

from jupyter_distrain.client import api
from jupyter_distrain.client.flags import flag_models, flag_table, spec_from_args
from jupyter_distrain.client.magics import DistributedMagics, checked_spec, line_error
from jupyter_distrain.contract.spec import JobSpec

SOURCES = Path(__file__).parent.parent / "labextension/src"
CASES = SOURCES / "__tests__/validation-cases.json"


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
        magics._start(checked_spec(line, "pass\n")[0])
    if message is not None:
        assert str(raised.value) == message
    assert line_error(line) == message  # what the form is told


def test_the_jest_tests_flag_table_is_the_servers():
    fixture = json.loads((SOURCES / "__tests__/flags.json").read_text())
    assert fixture == flag_models(), (
        "regenerate it: python -c 'import json; from jupyter_distrain.client.flags import "
        "flag_models; print(json.dumps(flag_models(), indent=2))' > "
        "labextension/src/__tests__/flags.json"
    )


def test_a_flag_left_at_its_default_gives_the_specs_default():
    """Each default is declared once, on the JobSpec field: a line without the flag and a
    spec without the field agree (a session's later cell relies on it: check_same)."""
    spec = JobSpec(code="")
    parsed = spec_from_args(parse_argstring(DistributedMagics.distributed, ""), "")
    for flag in flag_table():
        if flag.field:
            assert getattr(parsed, flag.field) == getattr(spec, flag.field), flag.flag


def test_the_form_lists_no_flag_of_its_own():
    """Its fields name flags of the table (their values from the server); a launcher's
    options are not among them: they come with the table."""
    source = (SOURCES / "distribute.ts").read_text()
    fields = re.findall(r"\{ flag: '([^']+)', label: '[^']*', kind: '(\w+)'", source)
    table = {flag.flag.removeprefix("--"): flag for flag in flag_table()}
    assert len(fields) > 10
    for name, kind in fields:
        assert name in table and not table[name].option, name
        if kind == "select":
            assert name in ("backend", "launcher") or table[name].choices, name
    for ts in SOURCES.glob("*.ts"):  # no list of flags anywhere in the extension
        assert "ssh-port" not in ts.read_text() and "sbatch" not in ts.read_text(), ts.name
