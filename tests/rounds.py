"""Run one pytest command several times and count each test's failures.

``python tests/rounds.py ROUNDS COMMAND...``: COMMAND (a pytest run, as the ordinary account
or not) is run ROUNDS times, each writing a JUnit report under ``build/tests/rounds/``; at
the end a table of every test that failed at least once (how often, the first line of its
last failure) and the totals. Exit status 1 when any round failed. ``make flake`` runs the
tests listed in ``tests/timing_sensitive.txt`` this way, to be run beside a load (a second
suite, or a CPU burner) where a flake shows.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPORTS = Path("build/tests/rounds")


def tally(report: Path, failures: Counter[str], why: dict[str, str]) -> int:
    """Count the failed tests of one JUnit report into ``failures``; how many ran."""
    ran = 0
    for case in ET.parse(report).getroot().iter("testcase"):
        ran += 1
        for bad in (*case.iter("failure"), *case.iter("error")):
            test = f"{case.get('classname')}::{case.get('name')}"
            failures[test] += 1
            why[test] = (
                (bad.get("message") or "").splitlines()[0][:160] if bad.get("message") else ""
            )
    return ran


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit(__doc__)
    rounds, command = int(argv[0]), argv[1:]
    REPORTS.mkdir(parents=True, exist_ok=True)
    REPORTS.chmod(0o1777)  # the ordinary account's pytest writes its report here
    failures: Counter[str] = Counter()
    why: dict[str, str] = {}
    ran = failed_rounds = 0
    started = time.monotonic()
    for number in range(1, rounds + 1):
        report = (REPORTS / f"{number}.xml").resolve()
        report.unlink(missing_ok=True)
        began = time.monotonic()
        code = subprocess.call([*command, f"--junitxml={report}", "-q"])
        if report.exists():
            ran += tally(report, failures, why)
        failed_rounds += code != 0
        print(
            f"== round {number}/{rounds}: exit {code} in {time.monotonic() - began:.0f} s",
            flush=True,
        )
    print(
        f"\n{rounds} rounds, {ran} test runs, {sum(failures.values())} failed, "
        f"{failed_rounds} rounds failed, {(time.monotonic() - started) / 60:.1f} min"
    )
    for test, count in failures.most_common():
        print(f"{count:4d}  {test}  {why.get(test, '')}")
    return 1 if failed_rounds else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
