"""The quick-start notebook, executed headless exactly as `make demo` runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "01-quickstart.ipynb"


def test_quickstart_notebook_trains_digits_to_90_percent(jobs_root):
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK.parent / "run.py"), str(NOTEBOOK)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JUPYTER_DISTRAIN_ROOT": str(jobs_root)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rates = [float(r) for r in re.findall(r"worker \d: (\d+) images/sec", proc.stdout)]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    accuracy = float(re.search(r"validation accuracy: ([\d.]+)", proc.stdout).group(1))
    assert accuracy >= 0.90
    assert NOTEBOOK.with_name("01-quickstart.executed.ipynb").exists()
