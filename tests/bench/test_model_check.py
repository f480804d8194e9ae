"""The model check at the suite's small bound: every schedule of the small worlds on the
real pure core, no violation; and planted bugs are caught with a replayable schedule.

The default bounds, their figures and what they leave out: docs/protocol.md, "The
exhaustive check".
"""

from __future__ import annotations

import pytest

from bench import model_check
from bench.model_check_mutations import MUTANTS, check_mutant
from bench.model_check_search import explore, replay
from bench.model_check_spec import Bounds, Violation

# Measured at the small bound: 10275 states; a floor well below it catches a search
# that silently stops exploring (a move generator that offers nothing, say).
STATES_FLOOR = 8000


def test_the_small_bound_has_no_violation() -> None:
    results = [explore(b) for b in model_check.searches(small=True)]
    doc = model_check.summary(results)
    assert doc["violations"] == 0, [r.violation for r in results if r.violation]
    assert doc["states"] > STATES_FLOOR
    covered = {(r.bounds.world, r.bounds.join) for r in results}
    assert covered == {(w, j) for w in (1, 2, 3) for j in (True, False)}
    # The behaviours the guarantees are about were reached, not just searched for.
    assert sum(r.stats.paced for r in results) > 0
    assert sum(r.stats.split for r in results) > 0
    assert sum(r.stats.idle for r in results) > 0
    assert sum(r.stats.carried for r in results) > 0
    assert all(r.stats.epoch_ends > 0 for r in results)


def test_a_schedule_replays_and_an_impossible_one_is_refused() -> None:
    bounds = Bounds(2, False, "balanced", False, True, 2)
    # Round 0: rank 0 reads two mediums (the ramp's 10 tokens), rank 1 its one short;
    # one step each empties both. Round 1: both dry, the epoch ends.
    assert replay(bounds, [2, 1], [[[5, 5], [3]], [[], []]]) == 2
    with pytest.raises(ValueError, match="ended before round 2"):
        replay(bounds, [2, 1], [[[5, 5], [3]], [[], []], [[], []]])
    with pytest.raises(ValueError, match="cannot read"):
        replay(bounds, [2, 1], [[[5, 5, 5], [3]]])  # past the view
    with pytest.raises(ValueError, match="cannot read"):
        replay(bounds, [2, 1], [[[], [3]]])  # an empty buffer that could read must


@pytest.mark.parametrize("name", ["idle_step_with_ids", "carry_not_dealt"])
def test_planted_bugs_are_caught_with_a_schedule_that_replays(name: str) -> None:
    mutant = next(m for m in MUTANTS if m.name == name)
    row = check_mutant(mutant, ["--stop-first", "--jobs", "1", "--mutants"])
    assert row["caught"], row
    found = row["violation"]
    bounds = next(b for b in model_check.searches(small=True) if b.label() == row["search"])
    # On the real code the same schedule runs (it is a valid schedule) and passes.
    try:
        replay(bounds, found["views"], found["rounds"])
    except Violation as exc:  # pragma: no cover - a failure names the real bug
        pytest.fail(f"the mutant's schedule breaks the real code too: {exc}")
