"""The per-epoch plans, pure: equal step counts, exactly-once coverage, budgets, orders."""

from __future__ import annotations

import random

import pytest

from baselines.config import BaselineConfig
from baselines.methods import BMTPlan, GMTPlan, PackingPlan, SortedPlan, StandardPlan
from baselines.plans import check_plan, deal
from odb.core.budget import GroupMeasure, TokenBudget
from odb.core.sharding import epoch_order, rank_view
from tests.baselines.toy import toy_lengths

BUDGET = 256


def _measure(step, lengths) -> GroupMeasure:
    m = GroupMeasure()
    for i in step:
        m = m.plus(lengths[i])
    return m


def _planners(lengths):
    return {
        "standard": StandardPlan(4),
        "sorted": SortedPlan(4, lengths),
        "gmt": GMTPlan(TokenBudget(BUDGET), lengths),
        "bmt": BMTPlan(TokenBudget(BUDGET), lengths),
        "packing": PackingPlan(TokenBudget(BUDGET, "packed"), lengths),
    }


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_every_plan_is_aligned_exact_and_within_budget(world_size: int, seed: int) -> None:
    lengths = toy_lengths(97, seed, high=300)  # some samples exceed the budget alone
    pool = epoch_order(len(lengths), seed, 0, True)
    for name, planner in _planners(lengths).items():
        plan = planner(pool, world_size, seed)
        check_plan(plan, pool)  # equal step counts, every index exactly once
        idle = sum(1 for steps in plan for step in steps if not step)
        assert idle < world_size or name == "standard", name
        if name in ("gmt", "bmt", "packing"):
            budget = planner.budget
            for steps in plan:
                for step in steps:
                    if len(step) > 1:
                        assert budget.fits(_measure(step, lengths)), (name, step)


def test_idle_steps_only_pad_the_tail_of_dealt_plans() -> None:
    plan = deal([(0,), (1,), (2,)], 2)
    assert plan == [[(0,), (2,)], [(1,), ()]]


def test_standard_reads_odb_rank_views_in_fixed_batches() -> None:
    pool = epoch_order(11, 3, 2, True)
    plan = StandardPlan(3)(pool, 2, seed=5)
    for rank in range(2):
        view = rank_view(11, rank, 2, seed=3, epoch=2, shuffle=True)
        assert [i for step in plan[rank] for i in step] == view
        assert all(len(step) == 3 for step in plan[rank][:-1])


def test_sorted_batches_are_contiguous_runs_of_the_length_order() -> None:
    lengths = toy_lengths(40, 1)
    pool = list(range(40))
    order = sorted(pool, key=lambda i: -lengths[i])
    fixed = SortedPlan(4, lengths, shuffle=False)(pool, 2, seed=0)
    # Unshuffled: longest first, W adjacent batches per step (rank order within a step).
    steps = [batch for step in zip(*fixed, strict=True) for batch in step if batch]
    assert [i for b in steps for i in b] == order
    shuffled = SortedPlan(4, lengths)(pool, 2, seed=7)
    batches = {b for steps in shuffled for b in steps if b}
    assert batches == {b for b in steps}  # same batches, steps in a seeded order
    assert shuffled != fixed and shuffled == SortedPlan(4, lengths)(pool, 2, seed=7)


def test_bmt_balances_per_step_cost_better_than_gmt() -> None:
    lengths = toy_lengths(400, 2, high=250)
    budget = TokenBudget(BUDGET)
    pool = list(range(400))

    def imbalance(plan) -> float:
        worst = 0.0
        for step in zip(*plan, strict=True):
            costs = [budget.cost(_measure(s, lengths)) for s in step if s]
            worst += max(costs) - min(costs)
        return worst / len(plan[0])

    gmt = GMTPlan(budget, lengths)(pool, 4, seed=0)
    bmt = BMTPlan(budget, lengths)(pool, 4, seed=0)
    assert sorted(map(sorted, gmt)) != sorted(map(sorted, bmt))
    assert imbalance(bmt) < 0.5 * imbalance(gmt)
    # Same groups, only their placement differs.
    assert {s for r in gmt for s in r if s} == {s for r in bmt for s in r if s}


def test_packing_fills_rows_better_than_sorted_adjacent_greedy() -> None:
    lengths = toy_lengths(300, 3, high=250)
    packed = TokenBudget(BUDGET, "packed")
    rows = PackingPlan(packed, lengths).rows(range(300))
    adjacent = GMTPlan(packed, lengths).groups(range(300))
    assert len(rows) < len(adjacent)
    fills = [sum(lengths[i] for i in r) / BUDGET for r in rows]
    assert sum(fills) / len(fills) > 0.95


def test_packing_refuses_a_padded_budget() -> None:
    with pytest.raises(ValueError, match="packed"):
        PackingPlan(TokenBudget(BUDGET), [1, 2])


def test_plans_are_deterministic_and_reshuffle_per_seed() -> None:
    lengths = toy_lengths(50, 4)
    pool = list(range(50))
    for name, planner in _planners(lengths).items():
        a, b = planner(pool, 2, 11), planner(pool, 2, 11)
        assert a == b, name
        if name != "standard":  # Standard's order is the pool's (already seeded)
            assert a != planner(pool, 2, 12), name


def test_default_fixed_batch_size_never_exceeds_the_budget_at_the_cutoff() -> None:
    assert BaselineConfig(token_budget=8192, cutoff_len=3000).fixed_batch_size() == 2
    assert BaselineConfig(token_budget=8192, batch_size=9).fixed_batch_size() == 9
    with pytest.raises(ValueError, match="cutoff_len"):
        BaselineConfig(token_budget=8192).fixed_batch_size()
    with pytest.raises(ValueError, match="raise token_budget or set batch_size"):
        BaselineConfig(token_budget=100, cutoff_len=200).fixed_batch_size()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"token_budget": 0}, "token_budget"),
        ({"token_budget": 8, "cost_model": "dense"}, "cost_model"),
        ({"token_budget": 8, "batch_size": 0}, "batch_size"),
        ({"token_budget": 8, "prefetch_factor": 2}, "num_workers"),
        ({"token_budget": 8, "align_timeout_s": 0}, "align_timeout_s"),
        ({"token_budget": 8, "shuffle": "yes"}, "shuffle"),
    ],
)
def test_bad_config_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        BaselineConfig(**kwargs)


def test_random_pools_keep_the_invariants() -> None:
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 60)
        lengths = [rng.randint(1, 400) for _ in range(n)]
        pool = rng.sample(range(n), rng.randint(0, n))
        world = rng.randint(1, 6)
        for planner in _planners(lengths).values():
            check_plan(planner(pool, world, rng.randint(0, 99)), pool)


def test_check_plan_refuses_a_plan_that_drops_repeats_or_misaligns() -> None:
    check_plan([[(0, 1)], [(2,)]], [0, 1, 2])
    for plan in ([[(0, 1)], [()]], [[(0, 1)], [(1, 2)]], [[(0,), (1,)], [(2,)]]):
        with pytest.raises(RuntimeError, match="plan bug"):
            check_plan(plan, [0, 1, 2])
