"""Run test modules N times in a row and count failures, hangs and each test's outcomes.

    python -m bench.repeat_tests tests/odb/test_faults.py --times 20 --out results/r.json
    python -m bench.repeat_tests --modules dist --times 20 --load 2 --out-dir results/repeats

Each repeat is a fresh ``pytest`` process (fresh interpreter, so nothing is shared
between repeats) with a hard limit (``--timeout-s``): a repeat still running then is a
**hang**, and its output is kept with every pytest thread's stack (pytest's
``faulthandler_timeout``, shortly before the limit) and each process's kernel waits
(:mod:`bench._repeat_run`). A **failure** is a repeat that did not hang but had a red
test, or exited non-zero. ``--modules dist`` repeats, one module at a time, every test
module with a test marked ``dist`` or ``slurm`` (collected, not listed by hand);
``--load N`` runs N busy processes beside the repeats. With ``--out-dir`` each
module's JSON goes to its own file there (``bench.repeat_table`` makes the Markdown
table), with the logs of repeats that did not pass under ``logs/``. Prints JSON: per
selection the repeats, failures, hangs, per test id the passes, failures, errors and
skips, and the wall times. With ``--stop-on-failure`` a selection's loop ends at its
first failure or hang (the "20 in a row" rule).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench._io import emit, machine, parser, progress
from bench._repeat_run import Load, pytest_command, run_limited

OUTCOMES = ("passed", "failed", "error", "skipped")
MODULE_SETS = {"dist": "dist or slurm"}  # --modules NAME: the marker expression
_RED = ("failed", "error")


def marked_modules(expression: str) -> list[str]:
    """Test modules holding a test that ``-m expression`` selects, in collection order."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    listing = subprocess.run(
        [*cmd, "-m", expression], check=False, capture_output=True, text=True
    ).stdout
    modules = [line.split("::", 1)[0] for line in listing.splitlines() if "::" in line]
    if not modules:
        raise RuntimeError(f"no test is marked {expression!r}: is this the repository root?")
    return list(dict.fromkeys(modules))


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


def repeat(
    selection: list[str],
    times: int,
    stop_on_failure: bool,
    limit_s: float = 1800.0,
    logs: Path | None = None,
) -> dict[str, Any]:
    """Run ``selection`` ``times`` times; count failures, hangs and outcomes per test.

    Logs of repeats that failed or hung are kept under ``logs`` (when given).
    """
    tally: dict[str, Counter] = defaultdict(Counter)
    walls: list[float] = []
    loads: list[float] = []
    failures, hangs, kept = 0, 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(times):
            junit, log = Path(tmp) / f"run{k}.xml", Path(tmp) / f"run{k}.log"
            code, wall = run_limited(pytest_command(selection, junit, limit_s), limit_s, log)
            walls.append(wall)
            loads.append(round(os.getloadavg()[0], 1))  # the machine may be shared
            outcomes = parse_junit(junit) if code is not None and junit.exists() else {}
            for test_id, outcome in outcomes.items():
                tally[test_id][outcome] += 1
            red = sorted(t for t, o in outcomes.items() if o in _RED)
            hung = code is None
            failed = not hung and (bool(red) or code != 0)
            hangs, failures = hangs + hung, failures + failed
            if (hung or failed) and logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                name = "_".join(Path(s).stem for s in selection)[:80]
                kept.append(str(shutil.copy(log, logs / f"{name}.repeat{k + 1}.log")))
            what = "HANG" if hung else f"exit {code}, {len(red)} red {red}"
            progress(f"{selection} repeat {k + 1}/{times}: {wall} s, {what}")
            if (hung or failed) and stop_on_failure:
                break
    runs = len(walls)
    per_test = {t: {o: c[o] for o in OUTCOMES} for t, c in sorted(tally.items())}
    return dict(
        selection=selection,
        repeats_run=runs,
        failures=failures,
        hangs=hangs,
        tests=len(per_test),
        all_passed_every_time=failures == 0 and hangs == 0,
        per_test=per_test,
        wall_s_per_repeat=walls,
        load_average_1min_per_repeat=loads,
        logs=kept,
    )


def _campaign(args: Any) -> dict[str, Any]:
    if args.modules:
        selections = [[m] for m in marked_modules(MODULE_SETS[args.modules])]
    else:
        selections = [args.selection]
    results = []
    with Load(args.load):
        for selection in selections:
            logs = args.out_dir / "logs" if args.out_dir is not None else None
            result = repeat(selection, args.times, args.stop_on_failure, args.timeout_s, logs)
            result |= dict(load=args.load, limit_s=args.timeout_s, machine=machine())
            results.append(result)
            if args.out_dir is not None:
                name = "_".join(Path(s).with_suffix("").as_posix() for s in selection)
                emit_to = args.out_dir / (name.replace("/", ".")[:150] + ".json")
                emit_to.parent.mkdir(parents=True, exist_ok=True)
                emit_to.write_text(json.dumps(result, indent=2) + "\n")
    return dict(
        command="python -m bench.repeat_tests " + " ".join(args.argv),
        all_passed_every_time=all(r["all_passed_every_time"] for r in results),
        selections=results,
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("Run test modules N times; count failures, hangs and outcomes per test.")
    p.add_argument("selection", nargs="*", help="pytest paths or node ids (one selection)")
    p.add_argument("--modules", choices=sorted(MODULE_SETS), help="each marked module alone")
    p.add_argument("--times", type=int, default=20, help="repeats (>= 1)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="a repeat's hard limit")
    p.add_argument("--load", type=int, default=0, help="busy processes beside the repeats")
    p.add_argument("--out-dir", type=Path, default=None, help="one JSON per selection here")
    p.add_argument("--stop-on-failure", action="store_true", help="stop at the first red run")
    args = p.parse_args(argv)
    if args.times < 1:
        p.error(f"--times must be >= 1, got {args.times}")
    if not args.selection and not args.modules:
        p.error("give a selection (pytest paths or node ids) or --modules dist")
    if args.selection and args.modules:
        p.error("give a selection or --modules, not both")
    if args.timeout_s <= 0 or args.load < 0:
        p.error(f"--timeout-s must be > 0 and --load >= 0, got {args.timeout_s}, {args.load}")
    args.argv = sys.argv[1:] if argv is None else argv
    result = _campaign(args)
    emit(result, args.out)
    return 0 if result["all_passed_every_time"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
