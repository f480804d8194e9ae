"""How often a rank aborts when it exits right after a Gloo collective, with and without ODB.

    python -m bench.exit_race --runs 50 --out results/bench/exit_race.json

Runs ``tests/odb/exit_race_script.py`` at W=2 under torchrun ``--runs`` times per mode,
alternating: ``bare`` (torch alone) and ``odb`` (``import odb``, whose exit hook hands
the GIL to Gloo's worker threads before finalization, ``odb/_process/gil_handoff.py``).
Prints JSON: per mode the runs, the runs that exited non-zero, those whose stderr says
"terminate called without an active exception", and the exit codes seen.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench._io import emit, machine, parser, progress
from harness.torchrun import run_torchrun

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "odb" / "exit_race_script.py"
MODES = ("bare", "odb")
ABORT_TEXT = "terminate called without an active exception"


def run_modes(runs: int) -> dict[str, Any]:
    """``runs`` torchrun launches of each mode, alternating; counts per mode."""
    tally = {mode: {"runs": 0, "failed": 0, "aborted": 0, "codes": Counter()} for mode in MODES}
    for index in range(runs):
        for mode in MODES:
            code, _, err = run_torchrun(
                SCRIPT, 2, [mode], timeout=120, env={"OMP_NUM_THREADS": "1"}
            )
            row = tally[mode]
            row["runs"] += 1
            row["failed"] += code != 0
            row["aborted"] += ABORT_TEXT in err
            row["codes"][str(code)] += 1
        progress(
            f"run {index + 1}/{runs}: "
            + ", ".join(f"{m} {tally[m]['failed']} failed" for m in MODES)
        )
    return {m: {**row, "codes": dict(row["codes"])} for m, row in tally.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20, help="launches per mode (default 20)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    modes = run_modes(args.runs)
    result = {"runs_per_mode": args.runs, "world_size": 2, "modes": modes, "machine": machine()}
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
