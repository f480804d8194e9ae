"""Run a test selection N times in a row and count every test's outcomes (flakiness check).

    python -m bench.repeat_tests tests/odb/test_faults.py --times 20 --out results/r.json

Each repeat is a fresh ``pytest`` process (fresh interpreter, so nothing is shared
between repeats). Prints JSON: per test id the passes, failures, errors and skips over
the repeats, the repeats' wall times, and whether every test passed every time. With
``--stop-on-failure`` the loop ends at the first red repeat (the "20 in a row" rule).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench._io import emit, machine, parser, progress

OUTCOMES = ("passed", "failed", "error", "skipped")


def run_once(selection: list[str], junit: Path) -> dict[str, str]:
    """One pytest run of ``selection``; the outcome of each test id."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    subprocess.run(cmd + selection, check=False, stdout=subprocess.DEVNULL)
    return parse_junit(junit)


def parse_junit(path: Path) -> dict[str, str]:
    """``{test id: outcome}`` from a JUnit XML report; a missing report is an error."""
    if not path.exists():
        raise RuntimeError(f"pytest wrote no report at {path}: did the selection collect?")
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[test_id] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes


def repeat(selection: list[str], times: int, stop_on_failure: bool) -> dict[str, Any]:
    """Run ``selection`` ``times`` times; tally outcomes per test."""
    tally: dict[str, Counter] = defaultdict(Counter)
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(times):
            started = time.perf_counter()
            outcomes = run_once(selection, Path(tmp) / f"run{k}.xml")
            walls.append(round(time.perf_counter() - started, 1))
            for test_id, outcome in outcomes.items():
                tally[test_id][outcome] += 1
            red = sorted(t for t, o in outcomes.items() if o in ("failed", "error"))
            progress(f"repeat {k + 1}/{times}: {len(outcomes)} tests, {len(red)} red {red}")
            if red and stop_on_failure:
                break
    runs = len(walls)
    per_test = {t: {o: c[o] for o in OUTCOMES} for t, c in sorted(tally.items())}
    return dict(
        command="python -m bench.repeat_tests " + " ".join(selection) + f" --times {times}",
        repeats_run=runs,
        tests=len(per_test),
        all_passed_every_time=all(c["passed"] == runs for c in per_test.values()),
        per_test=per_test,
        wall_s_per_repeat=walls,
        machine=machine(),
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("Run a pytest selection N times and count outcomes per test.")
    p.add_argument("selection", nargs="+", help="pytest paths or node ids")
    p.add_argument("--times", type=int, default=20, help="repeats (>= 1)")
    p.add_argument("--stop-on-failure", action="store_true", help="stop at the first red run")
    args = p.parse_args(argv)
    if args.times < 1:
        p.error(f"--times must be >= 1, got {args.times}")
    result = repeat(args.selection, args.times, args.stop_on_failure)
    emit(result, args.out)
    return 0 if result["all_passed_every_time"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
