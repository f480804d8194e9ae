"""CI slice of the randomized soak (``python -m bench.soak``): 30 scenarios.

The full run (>= 500 scenarios, reported in ``docs/reliability.md``) draws the same
space; this slice uses its cheaper ``quick`` draw so it stays near a minute on 2 cores.
Set ``ODB_SOAK_SEED`` to try other seeds.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench.soak import run_soak

pytestmark = pytest.mark.dist

SEED = int(os.environ.get("ODB_SOAK_SEED", "20000"))


@pytest.fixture(scope="module")
def slice_result() -> dict[str, Any]:
    return run_soak(30, seed=SEED, batch=10, quick=True, quiet=True)


def test_soak_slice_no_hang_loss_or_disagreement(slice_result: dict[str, Any]) -> None:
    result = slice_result
    assert result["scenarios_run"] == 30
    for key in ("hangs", "lost_ids", "step_count_disagreements", "budget_violations"):
        assert result[key] == 0, (key, result["failure_details"])
    others = [f for f in result["failure_details"] if _duplicates_only(f) is None]
    assert not others, others
    # The slice covers the space it claims to.
    assert len(result["by_world_size"]) == 4
    assert set(result["by_collate_mode"]) == {"thread", "process"}
    assert set(result["by_termination"]) == {"join", "non-join"}


@pytest.mark.xfail(
    strict=False,
    reason="known bug outside odb/runner.py: in non-join mode a carried sample that is "
    "also in the next epoch's fresh view is emitted twice in that epoch (odb/loader.py "
    "builds view = carry + fresh); see docs/reliability.md",
)
def test_soak_slice_no_duplicates(slice_result: dict[str, Any]) -> None:
    assert slice_result["duplicated_ids"] == 0, slice_result["failure_details"]


def _duplicates_only(failure: dict[str, Any]) -> dict[str, int] | None:
    """The failure's counts when it is only a non-join duplicate (the known bug)."""
    counts = failure.get("counts")
    if failure.get("kind") == "invariant" and counts and set(counts) == {"duplicated_ids"}:
        return counts
    return None
