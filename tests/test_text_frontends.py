"""Where no widget is drawn: ``jupyter console`` (a kernel's client that shows the
display's text and the streams, not display updates) and terminal IPython (no kernel:
the text summary), each driven in a pseudo-terminal as a user types.

The jobs are the plain backend's, a few seconds of reported steps, so each test takes
about ten seconds.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

from jupyter_distrain.contract.store import JobDir

BIN = Path(sys.executable).parent
ANSI = r"(?:\x1b\[[0-9;]*m)*"  # jupyter console colours its prompt
PROMPT = rf"In \[{ANSI}\d+{ANSI}\]: "
STEPS = 15
# no indented line: jupyter console's editor indents the line after a `for ...:` itself
CELL = [
    "%%distributed --workers 2 --backend plain",
    "import time",
    "from jupyter_distrain import report",
    f"for step in range(1, {STEPS + 1}): time.sleep(0.4); "
    f"report(step=step, images=32, total_steps={STEPS})",
    "",
    "",  # two Enters on an empty line end a cell magic's cell (IPython's check_complete)
]


def start(program: str, *args: str, cwd: Path) -> pexpect.spawn:
    """``program`` in a pseudo-terminal, at its first prompt, with the extension loaded."""
    env = {**os.environ, "TERM": "xterm", "PYTHONUNBUFFERED": "1"}
    child = pexpect.spawn(
        str(BIN / program), list(args), cwd=str(cwd), env=env, encoding="utf-8", timeout=60
    )
    child.expect(PROMPT)
    type_line(child, "%load_ext jupyter_distrain")
    child.expect(PROMPT)
    return child


def type_line(child: pexpect.spawn, line: str) -> None:
    """Type ``line`` and Enter (a carriage return, as a terminal sends it)."""
    child.send(line + "\r")


def run_cell(child: pexpect.spawn) -> None:
    """Type the job's cell, as a user would."""
    for line in CELL:
        type_line(child, line)


def live_line(child: pexpect.spawn, jobs_root: Path) -> str:
    """Wait for a summary line of the running job; check that the job still runs then.
    Returns the job's id."""
    child.expect(r"\[(job-[\w-]+)\] running: 2/2 processes up, step \d+", timeout=60)
    job_id = child.match.group(1)
    assert JobDir(jobs_root / job_id).read_state().state == "running"  # live: not at the end
    return job_id


def finish(child: pexpect.spawn, job_id: str) -> str:
    """The output up to the end of the cell (the next prompt); then quit."""
    child.expect(PROMPT, timeout=60)
    text = child.before
    type_line(child, "exit")
    child.expect(pexpect.EOF, timeout=30)
    assert re.search(rf"\[{job_id}\] succeeded: .*step {STEPS}/{STEPS} \(100%\)", text), text
    return text


@pytest.fixture
def terminal(tmp_path, monkeypatch):
    """Starts a program as :func:`start` does, with no IPython profile or Jupyter config
    of the user's; whatever is still running at the end is closed (a failed test's)."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter"))
    children: list[pexpect.spawn] = []

    def started(program: str, *args: str) -> pexpect.spawn:
        children.append(start(program, *args, cwd=tmp_path))
        return children[-1]

    yield started
    for child in children:
        child.close(force=True)


def test_jupyter_console_shows_the_jobs_summary_and_live_progress(jobs_root, terminal):
    """The display's text is the summary line (not a widget's repr), and summary lines
    follow the job while it runs, ending with its final state."""
    # its full editor: the simple prompt reads one line per cell
    child = terminal("jupyter-console", "--kernel", "python3")
    run_cell(child)
    child.expect(r"\[(job-[\w-]+)\] pending: ")  # the display
    shown = child.match.group(1)
    job_id = live_line(child, jobs_root)
    assert job_id == shown
    text = finish(child, job_id)
    assert "Widget" not in text


def test_terminal_ipython_prints_the_text_summary(jobs_root, terminal):
    """No kernel: the terminal's text summary, a line on each change of state."""
    child = terminal("ipython", "--simple-prompt", "--colors=NoColor")
    run_cell(child)
    job_id = live_line(child, jobs_root)
    finish(child, job_id)
