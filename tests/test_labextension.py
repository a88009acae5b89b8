"""The JupyterLab extension's "Distribute cell..." form refuses a bad value with the
magic's own message: the cases its Jest tests check (labextension/src/__tests__/
validation-cases.json) are checked here against the magic itself; and the form's flags
(magicline.ts's FLAGS) are the magic's flag table, so the two cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_distrain.client import api
from jupyter_distrain.client.flags import flag_table
from jupyter_distrain.client.magics import DistributedMagics
from jupyter_distrain.plugins import BACKENDS, LAUNCHERS, plugin_names

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


MAGICLINE = Path(__file__).parent.parent / "labextension/src/magicline.ts"
_TS_FLAG = re.compile(
    r"\{ name: '(?P<name>[^']+)', kind: '(?P<kind>\w+)', default: '(?P<default>[^']*)'"
    r"(?:, short: '(?P<short>\w)')? \}"
)


def _ts_default(value: object) -> str:
    """A default as magicline.ts writes it: '' for none (and for a switch or a list)."""
    if value is None or value is False or value in ([], ""):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_the_forms_flags_are_the_flag_tables():
    source = MAGICLINE.read_text()
    listed = source[source.index("export const FLAGS") : source.index("];")]
    in_ts = {m["name"]: m.groupdict() for m in _TS_FLAG.finditer(listed)}
    table = {
        flag.flag.removeprefix("--"): {
            "name": flag.flag.removeprefix("--"),
            "kind": flag.kind,
            "default": _ts_default(flag.default),
            "short": flag.short.removeprefix("-") or None,
        }
        for flag in flag_table()
    }
    assert in_ts == table
    for flag in flag_table():  # the values the form checks a flag against, as a TS list
        if flag.choices:
            assert "[" + ", ".join(f"'{c}'" for c in flag.choices) + "]" in source, flag.flag


def test_the_forms_fields_are_flags_of_the_table_with_its_choices():
    source = (MAGICLINE.parent / "distribute.ts").read_text()
    fields = re.findall(
        r"flag: '([^']+)',[^}]*?kind: '(\w+)'(?:,\s*options: \[([^\]]*)\])?", source
    )
    table = {flag.flag.removeprefix("--"): flag for flag in flag_table()}
    choices = {
        "backend": ("auto", *plugin_names(BACKENDS)),
        "launcher": tuple(plugin_names(LAUNCHERS)),
        **{name: flag.choices for name, flag in table.items() if flag.choices},
    }
    assert len(fields) > 10
    for name, kind, options in fields:
        assert name in table, name
        if kind == "select":
            assert set(re.findall(r"'([^']+)'", options)) == set(choices[name]), name
