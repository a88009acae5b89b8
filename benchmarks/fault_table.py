"""Runs the fault-injection suite (tests/faults) and prints what it injected and what
survived: faults survived, processes left, log lines lost, and the bad inputs tried by
the hardening and channel tests. One run, one table (for the closing notes).

    .venv/bin/python benchmarks/fault_table.py
    .venv/bin/python benchmarks/fault_table.py --rows FILE   # the rows a whole test run
                                        # wrote with FAULT_REPORT=FILE, as a table
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def print_table(rows: list[dict]) -> None:
    """The rows (one per injected fault) and their sums."""
    print(
        f"{'fault':<48} {'survived':<9} {'state':<10} {'left':>4} {'lines on disk':>13} "
        f"{'lost':>4} {'outside':>7}"
    )
    for row in rows:
        print(
            f"{row['fault']:<48} {str(row['survived']):<9} {row['state']:<10} "
            f"{row['processes_left']:>4} {row.get('lines_on_disk', '-'):>13} "
            f"{row['lines_lost']:>4} {row.get('files_outside', '-'):>7}"
        )
    survived = sum(r["survived"] for r in rows)
    print(
        f"\nfaults survived: {survived}/{len(rows)}; processes left: "
        f"{sum(r['processes_left'] for r in rows)}; log lines lost: "
        f"{sum(r['lines_lost'] for r in rows)}; files written outside the job directory: "
        f"{sum(r.get('files_outside', 0) for r in rows)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, help="print the rows a test run wrote there")
    args = parser.parse_args()
    if args.rows:
        print_table([json.loads(line) for line in args.rows.read_text().splitlines()])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        env = {**os.environ, "FAULT_REPORT": str(report)}
        suites = ["tests/faults", "tests/test_hardening.py", "tests/test_channels.py"]
        suites.append("tests/test_delivery.py")  # what hosts send back: crafted archives
        suites.append(  # a host of another version, leftovers of killed jobs on hosts
            "tests/test_ssh.py::test_a_host_with_an_agent_of_another_version_is_refused_in_one_line"
        )
        suites.append(
            "tests/test_ssh.py::test_what_a_killed_job_left_on_the_hosts_goes_at_the_next_contact"
        )
        suites.append(
            "tests/test_pool.py::test_a_pooled_rank_failing_after_its_keeper_is_killed_fails_the_job"
        )
        suites.append(
            "tests/test_pool.py::test_losing_the_keeper_then_the_supervisor_leaves_no_process_of_the_job"
        )
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        rows = (
            [json.loads(line) for line in report.read_text().splitlines()]
            if report.exists()
            else []
        )
    print_table(rows)
    counts = re.search(r"(\d+) passed(?:, (\d+) failed)?", run.stdout)
    print(
        f"bad-input, channel and delivery tests (hardening + channels + faults + delivery): "
        f"{counts.group(0) if counts else run.stdout[-500:]}"
    )
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
