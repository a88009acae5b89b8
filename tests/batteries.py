"""Run the test batteries side by side and say how long each took.

``python tests/batteries.py [--jobs N] NAME=COMMAND [NAME=COMMAND ...]``: each battery is
one shell command (a pytest run as an ordinary account or as root, a setup step, the UI
tests); a battery named ``NAME<AFTER`` starts only once battery ``AFTER`` has passed (the
second run's batteries wait for its virtualenv). At most ``--jobs`` run at once, in the
order given; one named ``+NAME`` (an install, which waits on the network and the disk)
starts at once and takes no place among them. Each battery's output goes to ``build/tests/NAME.log``; when it ends, its
last lines (pytest's summary and slowest tests) are printed, all of it when it failed.
At the end: a table of every battery's time and outcome, then each failed battery's
failed tests with their one-line reasons (CI's excerpt of a long log keeps its end); the
exit status is 1 when any failed or could not start.

Why a runner and not ``make -j``: two accounts' batteries (and the second virtualenv's
setup) share no state and leave a third of two cores idle when run one after another;
run side by side, each one's output still has to be read whole, and CI's log has to say
where the time went.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LOGS = Path("build/tests")
TAIL_LINES = 40  # a passing battery's summary and its slowest tests
SUMMARY_LINES = 60  # of a failed battery's short test summary, at the end


@dataclass
class Battery:
    name: str
    command: str
    after: str | None = None
    light: bool = False  # an install: it runs beside the --jobs batteries
    log: Path = field(init=False)
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None

    def __post_init__(self) -> None:
        self.log = LOGS / f"{self.name}.log"

    @classmethod
    def parse(cls, text: str) -> Battery:
        name, sep, command = text.partition("=")
        if not sep or not name or not command:
            raise SystemExit(f"batteries: {text!r} is not NAME=COMMAND")
        name, _, after = name.partition("<")
        light = name.startswith("+")
        return cls(name.lstrip("+"), command, after or None, light)

    def start(self) -> None:
        self.started = time.monotonic()
        print(f"== {self.name}: started ({self.command})", flush=True)
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", "-c", self.command], stdout=out, stderr=subprocess.STDOUT
            )

    def poll(self) -> bool:
        """True once it has ended (said, with its output)."""
        if self.process is None or self.process.poll() is None:
            return False
        self.code = self.process.returncode
        self.seconds = time.monotonic() - self.started
        lines = self.log.read_text(errors="replace").splitlines()
        shown = lines if self.code else lines[-TAIL_LINES:]
        print(f"== {self.name}: {self.outcome} in {minutes(self.seconds)} ==", flush=True)
        print("\n".join(shown), flush=True)
        return True

    def failures(self) -> list[str]:
        """pytest's short test summary (each failed test and its reason) from this
        battery's log; empty where there is none (a setup, the UI tests)."""
        lines = self.log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if "short test summary info" in line), -1)
        if start < 0:
            return []
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), None)
        return lines[start + 1 : end][:SUMMARY_LINES]

    @property
    def outcome(self) -> str:
        if self.code is None:
            return "not run"
        return "passed" if self.code == 0 else f"FAILED (exit {self.code})"


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def run(batteries: list[Battery], jobs: int) -> bool:
    """Run every battery whose prerequisite passed, ``jobs`` at a time; True if all did."""
    names = {b.name for b in batteries}
    for b in batteries:
        if b.after is not None and b.after not in names:
            raise SystemExit(f"batteries: {b.name} waits for {b.after}, which is not given")
    LOGS.mkdir(parents=True, exist_ok=True)
    waiting, running = list(batteries), []
    done: dict[str, Battery] = {}
    while waiting or running:
        for b in [b for b in running if b.poll()]:
            running.remove(b)
            done[b.name] = b
        for b in list(waiting):
            if b.after is not None and b.after not in done:
                continue  # its prerequisite has not ended yet
            if b.after is not None and done[b.after].code != 0:
                waiting.remove(b)  # never started: its prerequisite failed
                done[b.name] = b
                continue
            if not b.light and len([r for r in running if not r.light]) >= jobs:
                continue
            waiting.remove(b)
            b.start()
            running.append(b)
        time.sleep(0.5)
    print("== batteries ==")
    for b in batteries:
        print(f"  {b.name:<16} {minutes(b.seconds):>6}  {b.outcome}")
    for b in batteries:
        if b.code:
            print(f"== {b.name}: what failed ==")
            print("\n".join(b.failures()) or f"(no test named: see {b.log})", flush=True)
    return all(b.code == 0 for b in batteries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="batteries run at once")
    parser.add_argument("batteries", nargs="+", metavar="NAME=COMMAND")
    args = parser.parse_args()
    started = time.monotonic()
    ok = run([Battery.parse(text) for text in args.batteries], args.jobs)
    print(
        f"== all batteries: {'passed' if ok else 'FAILED'} in {minutes(time.monotonic() - started)}"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
