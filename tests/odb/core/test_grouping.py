"""Tests for odb.core.grouping: conservation, budget, optimality, emission order, splitting, aging.

Optimality is checked against two exact minima written here, independently of the
code under test: a DP over contiguous runs of the sorted order, and (n <= 8) brute
force over every set partition.
"""

import doctest
import math
import random
from collections import Counter

import pytest
from hypothesis import strategies as st

import odb.core.grouping
from odb.core.budget import GroupMeasure, TokenBudget
from odb.core.grouping import (
    Group,
    SizedSample,
    emission_order,
    form_groups,
    split_lighter,
    split_to_count,
)
from tests.tiers import tiered

# ---------------------------------------------------------------- strategies and helpers


@st.composite
def budgets(draw, cost_models=("padded", "packed"), patch_budget=True):
    max_patches = draw(st.none() | st.integers(1, 20)) if patch_budget else None
    return TokenBudget(
        max_tokens=draw(st.integers(1, 64)),
        cost_model=draw(st.sampled_from(cost_models)),
        max_patches=max_patches,
    )


def lengths_for(budget):
    """Lengths that stress the edges: over budget, equal to it, and exact divisors."""
    b = budget.max_tokens
    edges = sorted({1, b, b + 1, max(1, b // 2), max(1, b // 3), max(1, b // 4)})
    return st.integers(1, b + 8) | st.sampled_from(edges)


@st.composite
def items_for(draw, budget, max_size=40, with_patches=True, with_ages=False):
    n = draw(st.integers(0, max_size))
    # A small pool forces duplicate lengths (the tie-breaking path) most of the time.
    pool = draw(st.lists(lengths_for(budget), min_size=1, max_size=6))
    lengths = draw(st.lists(st.sampled_from(pool) | lengths_for(budget), min_size=n, max_size=n))
    keys = draw(st.lists(st.integers(-(10**6), 10**6), min_size=n, max_size=n, unique=True))
    patches = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)) if with_patches else [0] * n
    ages = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)) if with_ages else [0] * n
    return [SizedSample(*fields) for fields in zip(keys, lengths, patches, ages, strict=True)]


@st.composite
def cases(draw, cost_models=("padded", "packed"), patch_budget=True, max_size=40):
    budget = draw(budgets(cost_models, patch_budget))
    return draw(items_for(budget, max_size=max_size, with_patches=patch_budget)), budget


def measure_of(items):
    m = GroupMeasure()
    for item in items:
        m = m.plus(item.length, item.patches)
    return m


def key_counts(groups):
    return Counter(key for g in groups for key in g.keys)


def sort_order(items):
    return sorted(items, key=lambda i: (-i.length, i.key))


def valid_padded(lengths, capacity):
    return len(lengths) == 1 or max(lengths) * len(lengths) <= capacity


def min_groups_dp(lengths, capacity):
    """Fewest contiguous runs of the descending order, each a singleton or within budget."""
    s = sorted(lengths, reverse=True)
    best = [0] + [math.inf] * len(s)
    for i in range(1, len(s) + 1):
        for j in range(i):
            if valid_padded(s[j:i], capacity):
                best[i] = min(best[i], best[j] + 1)
    return best[len(s)]


def set_partitions(xs):
    if not xs:
        yield []
        return
    first, rest = xs[0], xs[1:]
    for p in set_partitions(rest):
        yield [[first], *p]
        for i in range(len(p)):
            yield [*p[:i], [first, *p[i]], *p[i + 1 :]]


def min_groups_brute_force(lengths, capacity):
    """Fewest blocks over every set partition whose blocks are all valid."""
    return min(
        len(p)
        for p in set_partitions(list(lengths))
        if all(valid_padded(block, capacity) for block in p)
    )


# ---------------------------------------------------------------- docs and validation


def test_docstring_examples_run():
    assert doctest.testmod(odb.core.grouping).failed == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"length": 0}, "length must be >= 1, got 0"),
        ({"length": -3}, "length must be >= 1, got -3"),
        ({"length": 5, "patches": -1}, "patches=-1"),
        ({"length": 5, "age": -2}, "age=-2"),
    ],
)
def test_invalid_items_are_rejected_with_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SizedSample(key=1, **kwargs)


def test_duplicate_keys_are_rejected():
    with pytest.raises(ValueError, match="key 4 repeats"):
        form_groups([SizedSample(4, 2), SizedSample(4, 3)], TokenBudget(10))


def test_empty_group_is_rejected():
    with pytest.raises(ValueError, match="at least one item"):
        Group((), GroupMeasure(), complete=False)


def test_empty_buffer_gives_no_groups():
    assert form_groups([], TokenBudget(10)) == []


# ---------------------------------------------------------------- form_groups


@tiered(300, cases())
def test_form_groups_conserves_items(case):
    items, budget = case
    assert key_counts(form_groups(items, budget)) == Counter(i.key for i in items)


@tiered(300, cases())
def test_multi_item_groups_fit_and_only_oversize_items_exceed(case):
    items, budget = case
    for g in form_groups(items, budget):
        assert g.measure == measure_of(g.items)
        if g.size > 1:
            assert budget.fits(g.measure)
        elif not budget.fits(g.measure):
            assert budget.is_oversize(g.items[0].length, g.items[0].patches)


@tiered(300, cases())
def test_oversize_items_are_singletons(case):
    items, budget = case
    for g in form_groups(items, budget):
        if any(budget.is_oversize(i.length, i.patches) for i in g.items):
            assert g.size == 1 and g.complete


@tiered(300, cases(), st.randoms(use_true_random=False))
def test_groups_are_adjacent_runs_longest_first_and_order_independent(case, rnd):
    items, budget = case
    groups = form_groups(items, budget)
    assert [i for g in groups for i in g.items] == sort_order(items)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert form_groups(shuffled, budget) == groups


@tiered(300, cases())
def test_complete_flags(case):
    """Complete iff the next item did not fit, or no item (length 1, no patches) could."""
    items, budget = case
    groups = form_groups(items, budget)
    for g, nxt in zip(groups, groups[1:], strict=False):
        first = nxt.items[0]
        assert g.complete
        assert not budget.admits(g.measure, first.length, first.patches)
    if groups:
        last = groups[-1]
        assert last.complete == (not budget.admits(last.measure, 1))
        assert sum(not g.complete for g in groups) <= 1


def test_complete_flag_examples():
    budget = TokenBudget(12)
    tail = form_groups([SizedSample(0, 4), SizedSample(1, 4)], budget)
    assert [(g.keys, g.complete) for g in tail] == [((0, 1), False)]
    exact = form_groups([SizedSample(0, 4), SizedSample(1, 4), SizedSample(2, 4)], budget)
    assert [(g.keys, g.complete) for g in exact] == [((0, 1, 2), True)]
    oversize = form_groups([SizedSample(0, 13)], budget)
    assert [(g.keys, g.complete) for g in oversize] == [((0,), True)]


# ---------------------------------------------------------------- optimality (padded)


@tiered(500, cases(cost_models=("padded",), patch_budget=False, max_size=40))
def test_greedy_count_equals_contiguous_dp_minimum(case):
    items, budget = case
    groups = form_groups(items, budget)
    assert len(groups) == min_groups_dp([i.length for i in items], budget.max_tokens)


@tiered(400, cases(cost_models=("padded",), patch_budget=False, max_size=8))
def test_greedy_count_equals_brute_force_over_all_partitions(case):
    items, budget = case
    lengths = [i.length for i in items]
    groups = form_groups(items, budget)
    assert len(groups) == min_groups_brute_force(lengths, budget.max_tokens)
    assert len(groups) == min_groups_dp(lengths, budget.max_tokens)


def test_brute_force_helper_sees_non_contiguous_partitions():
    # Sanity check on the oracle itself: Bell(5) partitions, and a case it must solve.
    assert sum(1 for _ in set_partitions(list(range(5)))) == 52
    assert min_groups_brute_force([9, 5, 5, 4, 4], 10) == 3


# ---------------------------------------------------------------- emission_order


@st.composite
def ready_groups(draw):
    """Arbitrary disjoint groups with random complete flags and ages (fit not needed)."""
    budget = draw(budgets())
    items = draw(items_for(budget, max_size=30, with_ages=True))
    draw(st.randoms(use_true_random=False)).shuffle(items)
    groups, start = [], 0
    while start < len(items):
        stop = start + draw(st.integers(1, 4))
        groups.append(Group.of(items[start:stop], complete=draw(st.booleans())))
        start = stop
    return groups, budget, draw(st.integers(0, 7))


def emission_class(g, age_limit):
    if max(i.age for i in g.items) >= age_limit:
        return 0
    return 1 if g.complete else 2


@tiered(300, ready_groups())
def test_emission_order_puts_overdue_first_then_complete_then_most_tokens(case):
    groups, budget, age_limit = case
    order = emission_order(groups, budget, age_limit)
    classes = [emission_class(g, age_limit) for g in order]
    assert classes == sorted(classes)
    for a, b in zip(order, order[1:], strict=False):
        ca, cb = emission_class(a, age_limit), emission_class(b, age_limit)
        if ca == cb == 0:
            assert max(i.age for i in a.items) >= max(i.age for i in b.items)
        elif ca == cb:
            assert a.measure.sum_len >= b.measure.sum_len


@tiered(300, ready_groups(), st.randoms(use_true_random=False))
def test_emission_order_is_a_permutation_and_independent_of_input_order(case, rnd):
    groups, budget, age_limit = case
    order = emission_order(groups, budget, age_limit)
    assert sorted(order, key=lambda g: g.keys) == sorted(groups, key=lambda g: g.keys)
    shuffled = list(groups)
    rnd.shuffle(shuffled)
    assert emission_order(shuffled, budget, age_limit) == order


def test_emission_order_tie_goes_to_smallest_key():
    budget = TokenBudget(10)
    a = Group.of([SizedSample(5, 4)], complete=True)
    b = Group.of([SizedSample(2, 4)], complete=True)
    assert emission_order([a, b], budget, 3) == [b, a]


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_emission_order_rejects_bad_age_limit(bad):
    with pytest.raises(ValueError, match=f"age_limit must be an int >= 0, got {bad!r}"):
        emission_order([], TokenBudget(10), bad)


# ---------------------------------------------------------------- split_to_count


@tiered(300, cases(), st.integers(0, 50))
def test_split_to_count(case, target):
    items, budget = case
    groups = form_groups(items, budget)
    result = split_to_count(groups, target, budget)
    assert key_counts(result) == Counter(i.key for i in items)
    if target <= len(groups):
        assert result == groups
    else:
        assert len(result) == min(target, len(items))
    if len(result) < target:
        assert all(g.size == 1 for g in result)
    for g in result:
        assert g.measure == measure_of(g.items)
        assert g.size == 1 or budget.fits(g.measure)
        assert g.complete == (not budget.admits(g.measure, 1)) or g in groups


def test_split_peels_shortest_off_largest_earliest_group():
    budget = TokenBudget(100)
    g1 = Group.of([SizedSample(0, 9), SizedSample(1, 8)], complete=True)
    g2 = Group.of([SizedSample(2, 7), SizedSample(3, 3), SizedSample(4, 3)], complete=True)
    g3 = Group.of([SizedSample(5, 6), SizedSample(6, 5), SizedSample(7, 1)], complete=True)
    result = split_to_count([g1, g2, g3], 5, budget)
    # g2 and g3 tie on size, g2 is earlier: peel its shortest (3 and 4 tie: larger key).
    # Then g3 is the largest: peel its shortest, key 7.
    assert [g.keys for g in result] == [(0, 1), (2, 3), (5, 6), (4,), (7,)]


@pytest.mark.parametrize("bad", [-1, True])
def test_split_rejects_bad_target(bad):
    with pytest.raises(ValueError, match=f"target must be an int >= 0, got {bad!r}"):
        split_to_count([], bad, TokenBudget(10))


# ---------------------------------------------------------------- split_lighter


def padding_efficiency(g):
    return g.measure.sum_len / (g.measure.max_len * g.size)


@tiered(300, cases(), st.integers(0, 50), st.data())
def test_split_lighter(case, count, data):
    items, budget = case
    groups = form_groups(items, budget)
    min_tokens = data.draw(st.integers(1, budget.max_tokens), label="min_tokens")
    pieces = split_lighter(groups, budget, count, min_tokens)
    assert key_counts(pieces) == Counter(i.key for i in items)
    assert len(pieces) >= len(groups)
    # Either at most ``count`` pieces, or the groups come back unchanged.
    assert len(pieces) <= count or pieces == groups
    it = iter(pieces)
    for g in groups:
        # Each group is cut into contiguous runs of its own (longest-first) order.
        run = []
        while len(run) < g.size:
            run += next(it).items
        assert tuple(run) == g.items
    for piece in pieces:
        assert piece.measure == measure_of(piece.items)
        assert piece.size == 1 or budget.fits(piece.measure)


@tiered(300, cases(cost_models=("padded",), patch_budget=False), st.integers(0, 50), st.data())
def test_split_lighter_uses_the_smallest_budget_and_never_pads_more(case, count, data):
    # Greedy grouping is optimal under the padded cost: the number of pieces only grows
    # as the budget shrinks, so the bisection finds the smallest budget that keeps
    # ``count`` (checked against a scan of every budget); and a run of a sorted group
    # never pads more than the group.
    items, budget = case
    groups = form_groups(items, budget)
    min_tokens = data.draw(st.integers(1, budget.max_tokens), label="min_tokens")
    pieces = split_lighter(groups, budget, count, min_tokens)

    def cut(tokens):
        return [p for g in groups for p in form_groups(g.items, TokenBudget(tokens))]

    fitting = [t for t in range(min_tokens, budget.max_tokens) if len(cut(t)) <= count]
    assert pieces == (cut(min(fitting)) if fitting else groups)
    padded_before = sum(g.measure.max_len * g.size for g in groups)
    assert sum(p.measure.max_len * p.size for p in pieces) <= padded_before


def test_split_lighter_example():
    budget = TokenBudget(24)
    groups = form_groups([SizedSample(k, n) for k, n in enumerate([6, 5, 4, 3, 3, 2])], budget)
    assert [g.keys for g in groups] == [(0, 1, 2, 3), (4, 5)]
    pieces = split_lighter(groups, budget, 3, 1)
    assert [p.keys for p in pieces] == [(0, 1), (2, 3), (4, 5)]  # at 12 tokens: 6*2, 4*2
    # Four pieces are allowed, but not below 20 tokens: only the 24-token group splits.
    assert [p.keys for p in split_lighter(groups, budget, 4, 20)] == [(0, 1, 2), (3,), (4, 5)]
    assert split_lighter(groups, budget, 2, 1) == groups  # already at most 2


# ---------------------------------------------------------------- aging simulation


def simulate(budget, k, age_limit, arrivals):
    """Runs rounds of arrive -> form_groups -> emit first k -> age the rest.

    Returns (ages at emission by key, max overdue items seen in one round).
    """
    buffer, emitted_age, max_overdue, next_key = [], {}, 0, 0
    rounds = iter(arrivals)
    while True:
        batch = next(rounds, None)
        if batch is None and not buffer:
            return emitted_age, max_overdue
        for length in batch or ():
            buffer.append(SizedSample(next_key, length))
            next_key += 1
        max_overdue = max(max_overdue, sum(i.age >= age_limit for i in buffer))
        order = emission_order(form_groups(buffer, budget), budget, age_limit)
        for g in order[:k]:
            for item in g.items:
                assert item.key not in emitted_age
                emitted_age[item.key] = item.age
        buffer = [
            SizedSample(i.key, i.length, i.patches, i.age + 1) for g in order[k:] for i in g.items
        ]


@st.composite
def aging_cases(draw, max_arrivals_per_k):
    budget = draw(budgets(patch_budget=False))
    k = draw(st.integers(1, 4))
    per_round = st.lists(lengths_for(budget), max_size=max_arrivals_per_k * k)
    arrivals = draw(st.lists(per_round, min_size=1, max_size=15))
    return budget, k, draw(st.integers(0, 5)), arrivals


@tiered(300, aging_cases(max_arrivals_per_k=1))
def test_no_item_waits_past_age_limit_when_arrivals_per_round_are_at_most_k(case):
    """Bound: with at most k arrivals per round, every item is emitted at age <= age_limit.

    Proof: let B_t be the overdue items at round t. At most k items turn overdue per
    round. If B_t spans >= k groups, the k emitted groups remove >= k overdue items, so
    B_{t+1} <= B_t; otherwise all of B_t is emitted and B_{t+1} <= k. Hence B_t <= k, so
    overdue items span at most k groups and are all emitted the round they turn overdue.
    """
    budget, k, age_limit, arrivals = case
    emitted_age, max_overdue = simulate(budget, k, age_limit, arrivals)
    assert len(emitted_age) == sum(map(len, arrivals))
    assert max_overdue <= k
    assert max(emitted_age.values(), default=0) <= age_limit


@tiered(300, aging_cases(max_arrivals_per_k=4))
def test_wait_is_bounded_by_age_limit_plus_overdue_backlog_over_k(case):
    """Bound: every item is emitted at age <= age_limit + (M - 1) // k, M >= 1.

    M is the most overdue items present in any one round. Proof: when item x turns
    overdue, let S be the overdue items at least as old as x (|S| <= M). Overdue groups
    go first, ordered by their oldest item, so in every later round in which x is not
    emitted, each of the k emitted groups precedes x's group and holds a distinct item
    of S other than x (ages rise together and arrivals are younger). So x waits at most
    (|S| - 1) // k rounds past age_limit.
    """
    budget, k, age_limit, arrivals = case
    emitted_age, max_overdue = simulate(budget, k, age_limit, arrivals)
    assert len(emitted_age) == sum(map(len, arrivals))
    bound = age_limit + max(0, max_overdue - 1) // k
    assert max(emitted_age.values(), default=0) <= bound


def test_form_groups_is_fast_on_a_large_buffer():
    rnd = random.Random(0)
    items = [SizedSample(i, rnd.randint(1, 4096)) for i in range(20_000)]
    groups = form_groups(items, TokenBudget(16_384))
    assert key_counts(groups) == Counter(range(20_000))
