"""A rank that exits right after a Gloo collective exits 0 once it has imported ``odb``.

Without ODB's exit hook, Gloo's worker thread can still be waiting for the GIL to drop
the collective's tensor when the interpreter finalizes, and the process aborts
("terminate called without an active exception"; ``odb/_process/gil_handoff.py``). The
race is decided by the scheduler and cannot be forced from Python: without the hook a
run aborts about one time in five idle, one in three loaded (``python -m
bench.exit_race``, ``docs/reliability.md``), so these six runs catch a lost hook in
about three tries of four idle, nineteen of twenty loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.torchrun import run_torchrun

SCRIPT = Path(__file__).with_name("exit_race_script.py")
RUNS = 6


@pytest.mark.dist
@pytest.mark.time_budget(150, reason="six torchrun launches at W=2")
def test_ranks_exiting_right_after_a_collective_exit_zero_with_odb() -> None:
    for run in range(RUNS):
        code, out, err = run_torchrun(SCRIPT, 2, ["odb"], timeout=120)
        assert code == 0, f"run {run + 1}/{RUNS}: exit code {code}\n{out[-1000:]}\n{err[-4000:]}"
        assert "terminate called" not in err, err[-4000:]
