"""Run test modules N times in a row and count failures, hangs and each test's outcomes.

    python -m bench.repeat_tests tests/odb/test_faults.py --times 20 --out results/r.json
    python -m bench.repeat_tests --modules dist --times 20 --load 2 --out-dir results/repeats

Each repeat is a fresh ``pytest`` process (fresh interpreter, so nothing is shared
between repeats) with a hard limit (``--timeout-s``): a repeat still running then is a
**hang**, and its output is kept with every pytest thread's stack (pytest's
``faulthandler_timeout``, shortly before the limit) and each process's kernel waits
(:mod:`bench._repeat_run`). A **failure** is a repeat that did not hang but had a red
test, or exited non-zero. ``--modules dist`` repeats, one module at a time, every test
module with a test marked ``dist`` or ``slurm`` (collected, not listed by hand), in
rounds: every module once per round. ``--load N`` runs N busy processes beside the
repeats. With ``--out-dir`` each module's JSON goes to its own file there after every
repeat (``bench.repeat_table`` makes the Markdown table), with the logs of repeats that
did not pass under ``logs/``; ``--resume`` goes on from those files when this checkout's
code is that of the commit they name (only docs may differ: a campaign that outlasts
one sitting, with its table committed between). Prints JSON: per selection the commit, the
repeats, failures, hangs, per test id the passes, failures, errors and skips, and the
wall times. With ``--stop-on-failure`` a selection is not repeated after its first
failure or hang (the "20 in a row" rule).
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


class Tally:
    """One selection's repeats so far: counts, per-test outcomes, walls, kept logs.

    Its JSON (:meth:`result`) is what ``--out-dir`` saves after every repeat, and what
    ``--resume`` reads back (:meth:`from_result`) to go on where a campaign stopped.
    """

    def __init__(self, selection: list[str], commit: str) -> None:
        self.selection, self.commit = selection, commit
        self.per_test: dict[str, Counter] = defaultdict(Counter)
        self.walls: list[float] = []
        self.loads: list[float] = []
        self.failures, self.hangs = 0, 0
        self.logs: list[str] = []

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> Tally:
        tally = cls(result["selection"], result["commit"])
        for test_id, counts in result["per_test"].items():
            tally.per_test[test_id].update(counts)
        tally.walls, tally.loads = (
            result["wall_s_per_repeat"],
            result["load_average_1min_per_repeat"],
        )
        tally.failures, tally.hangs, tally.logs = (
            result["failures"],
            result["hangs"],
            result["logs"],
        )
        return tally

    @property
    def runs(self) -> int:
        return len(self.walls)

    @property
    def red(self) -> bool:
        return self.failures + self.hangs > 0

    def run_once(self, limit_s: float, logs: Path | None) -> None:
        """One more repeat, counted; its log kept under ``logs`` when it did not pass."""
        k = self.runs + 1
        with tempfile.TemporaryDirectory() as tmp:
            junit, log = Path(tmp) / "run.xml", Path(tmp) / "run.log"
            code, wall = run_limited(pytest_command(self.selection, junit, limit_s), limit_s, log)
            outcomes = parse_junit(junit) if code is not None and junit.exists() else {}
            red = sorted(t for t, o in outcomes.items() if o in _RED)
            hung = code is None
            failed = not hung and (bool(red) or code != 0)
            if (hung or failed) and logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                name = "_".join(Path(s).stem for s in self.selection)[:80]
                self.logs.append(str(shutil.copy(log, logs / f"{name}.repeat{k}.log")))
        for test_id, outcome in outcomes.items():
            self.per_test[test_id][outcome] += 1
        self.walls.append(wall)
        self.loads.append(round(os.getloadavg()[0], 1))  # the machine may be shared
        self.hangs, self.failures = self.hangs + hung, self.failures + failed
        what = "HANG" if hung else f"exit {code}, {len(red)} red {red}"
        progress(f"{self.selection} repeat {k}: {wall} s, {what}")

    def result(self) -> dict[str, Any]:
        per_test = {t: {o: c[o] for o in OUTCOMES} for t, c in sorted(self.per_test.items())}
        return dict(
            selection=self.selection,
            commit=self.commit,
            repeats_run=self.runs,
            failures=self.failures,
            hangs=self.hangs,
            tests=len(per_test),
            all_passed_every_time=not self.red,
            per_test=per_test,
            wall_s_per_repeat=self.walls,
            load_average_1min_per_repeat=self.loads,
            logs=self.logs,
        )


# What a campaign does not count as its code: it may change between a campaign's repeats
# (the campaign's own table lands in docs/ after them).
NOT_CODE = (":(exclude)docs", ":(exclude)CHANGELOG.md", ":(exclude)README.md")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], check=False, capture_output=True, text=True)


def checkout_commit() -> str:
    """The commit of the checkout the tests run from, ``+dirty`` with uncommitted changes."""
    head = _git("rev-parse", "HEAD").stdout.strip() or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head + ("+dirty" if dirty else "")


def same_code(commit: str) -> bool:
    """Whether this checkout's code is ``commit``'s: no change outside :data:`NOT_CODE`,
    committed since or uncommitted."""
    if commit.endswith("+dirty"):
        return False
    return _git("diff", "--quiet", commit, "--", ".", *NOT_CODE).returncode == 0


def _result_path(out_dir: Path, selection: list[str]) -> Path:
    name = "_".join(Path(s).with_suffix("").as_posix() for s in selection)
    return out_dir / (name.replace("/", ".")[:150] + ".json")


def _tallies(args: Any, selections: list[list[str]], commit: str) -> list[Tally]:
    """A fresh tally per selection; with ``--resume``, the saved ones (same code)."""
    tallies = []
    for selection in selections:
        saved = _result_path(args.out_dir, selection) if args.out_dir is not None else None
        if args.resume and saved is not None and saved.exists():
            tally = Tally.from_result(json.loads(saved.read_text()))
            if not same_code(tally.commit):
                raise SystemExit(
                    f"{saved} holds repeats of commit {tally.commit}; this checkout "
                    f"({commit}) differs from it outside docs: a campaign counts one "
                    "code. Use another --out-dir."
                )
            tallies.append(tally)
        else:
            tallies.append(Tally(selection, commit))
    return tallies


def _campaign(args: Any) -> dict[str, Any]:
    """Round by round: each round repeats the least-repeated selections once, so a
    campaign cut short (or resumed later with ``--resume``, after a cut round) has
    covered every selection evenly."""
    if args.modules:
        selections = [[m] for m in marked_modules(MODULE_SETS[args.modules])]
    else:
        selections = [args.selection]
    tallies = _tallies(args, selections, checkout_commit())
    logs = args.out_dir / "logs" if args.out_dir is not None else None
    extra = dict(load=args.load, limit_s=args.timeout_s, machine=machine())
    with Load(args.load):
        while round_ := next_round(tallies, args.times, args.stop_on_failure):
            for tally in round_:
                tally.run_once(args.timeout_s, logs)
                if args.out_dir is not None:  # saved after every repeat: nothing lost to a stop
                    saved = _result_path(args.out_dir, tally.selection)
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    saved.write_text(json.dumps(tally.result() | extra, indent=2) + "\n")
    results = [tally.result() | extra for tally in tallies]
    return dict(
        command="python -m bench.repeat_tests " + " ".join(args.argv),
        all_passed_every_time=all(r["all_passed_every_time"] for r in results),
        selections=results,
    )


def next_round(tallies: list[Tally], times: int, stop_on_failure: bool) -> list[Tally]:
    """The selections the next round repeats: the least-repeated of those not done
    (``times`` repeats, or red with ``stop_on_failure``); none when all are done."""
    pending = [t for t in tallies if t.runs < times and not (stop_on_failure and t.red)]
    least = min((t.runs for t in pending), default=0)
    return [t for t in pending if t.runs == least]


def main(argv: list[str] | None = None) -> int:
    p = parser("Run test modules N times; count failures, hangs and outcomes per test.")
    p.add_argument("selection", nargs="*", help="pytest paths or node ids (one selection)")
    p.add_argument("--modules", choices=sorted(MODULE_SETS), help="each marked module alone")
    p.add_argument("--times", type=int, default=20, help="repeats (>= 1)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="a repeat's hard limit")
    p.add_argument("--load", type=int, default=0, help="busy processes beside the repeats")
    p.add_argument("--out-dir", type=Path, default=None, help="one JSON per selection here")
    p.add_argument("--stop-on-failure", action="store_true", help="stop at the first red run")
    p.add_argument(
        "--resume", action="store_true", help="go on from --out-dir's saved repeats (same code)"
    )
    args = p.parse_args(argv)
    if args.times < 1:
        p.error(f"--times must be >= 1, got {args.times}")
    if not args.selection and not args.modules:
        p.error("give a selection (pytest paths or node ids) or --modules dist")
    if args.selection and args.modules:
        p.error("give a selection or --modules, not both")
    if args.resume and args.out_dir is None:
        p.error("--resume goes on from the repeats saved in --out-dir: give --out-dir")
    if args.timeout_s <= 0 or args.load < 0:
        p.error(f"--timeout-s must be > 0 and --load >= 0, got {args.timeout_s}, {args.load}")
    args.argv = sys.argv[1:] if argv is None else argv
    result = _campaign(args)
    emit(result, args.out)
    return 0 if result["all_passed_every_time"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
