"""Wall time and failures of the test tiers, each run as its own pytest process.

Runs ``python -m pytest -m TIER`` for each tier (``unit``, ``ray``, ``process``, ``cluster``,
``not-unit`` (every tier but ``unit``); a name ending in ``-n2``, e.g. ``unit-n2``, runs that
selection on two pytest-xdist workers: the README's test command is ``unit-n2`` then
``not-unit-n2``), ``--repeat`` times in a
row, and prints one line per run (wall time, passed / failed / skipped, the load average before
and after: the box may be shared) and the failing tests by name; each run's whole pytest output,
with every test's duration, is written as it runs to ``--log-dir`` (a new temporary folder
unless given).
``--load`` keeps every CPU core busy with a spinning process for the whole time, for the loaded
repetitions of tests that must not race the clock.

    python bench/tiers.py                               # each tier once
    python bench/tiers.py unit unit-n2                  # the quick check, serial and on 2
    python bench/tiers.py unit-n2 not-unit-n2           # the README's test command, in two
    python bench/tiers.py process cluster --repeat 5 --load
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELECTIONS = {
    "unit": ["-m", "unit"],
    "not-unit": ["-m", "not unit"],
    "ray": ["-m", "ray"],
    "process": ["-m", "process"],
    "cluster": ["-m", "cluster"],
}
TIERS = {
    **SELECTIONS,
    **{f"{name}-n2": [*marks, "-n", "2"] for name, marks in SELECTIONS.items()},
}


def _spin() -> None:
    while True:
        pass


def run_tier(tier: str, log: Path) -> tuple[float, str, list[str]]:
    """One pytest process for ``tier``, its output written to ``log`` as it runs (a run that is
    stopped midway keeps what it printed, each test's duration included): wall seconds, pytest's
    summary line, failed test ids."""
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
        *TIERS[tier],
    ]  # fmt: skip
    began = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - began
    output = log.read_text()
    lines = output.strip().splitlines()
    summary = next((line for line in reversed(lines) if " in " in line), f"rc {done.returncode}")
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)
    return seconds, summary.strip("= "), failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="*", default=["unit", "ray", "process", "cluster"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--load", action="store_true", help="spin every core meanwhile")
    parser.add_argument("--log-dir", type=Path, help="where each run's pytest output is kept")
    args = parser.parse_args()
    unknown = sorted(set(args.tiers) - set(TIERS))
    if unknown:
        parser.error(f"unknown tier(s) {', '.join(unknown)}; choose from {', '.join(TIERS)}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="fusion-ray-tiers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    spinners = []
    if args.load:
        spinners = [
            multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)
        ]
        for spinner in spinners:
            spinner.start()
    print(f"{os.cpu_count()} cores{', every one kept busy by a spinner' if args.load else ''}")
    print(f"each run's output: {log_dir}", flush=True)
    try:
        for tier in args.tiers:
            for i in range(1, args.repeat + 1):
                name = f"{tier}-{'loaded-' if args.load else ''}run{i}.txt"
                before = os.getloadavg()[0]
                seconds, summary, failed = run_tier(tier, log_dir / name)
                load = f"load {before:.1f} -> {os.getloadavg()[0]:.1f}"
                print(f"{tier:<11} run {i}: {seconds:7.1f} s  {load}  {summary}", flush=True)
                for test in failed:
                    print(f"    failed: {test}", flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()


if __name__ == "__main__":
    main()
