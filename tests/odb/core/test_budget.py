"""Tests for odb.core.budget: validation, cost numbers, and the laws the grouper relies on."""

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import odb.core.budget
from odb.core.budget import GroupMeasure, TokenBudget

EXAMPLES = settings(max_examples=300, deadline=None)


def test_docstring_examples_run():
    assert doctest.testmod(odb.core.budget).failed == 0


@pytest.mark.parametrize("bad", [0, -1, -8192])
def test_nonpositive_max_tokens_names_the_value(bad):
    with pytest.raises(ValueError, match=rf"max_tokens must be > 0, got {bad}"):
        TokenBudget(bad)


@pytest.mark.parametrize("bad", [True, False, 8192.0, "8192", None])
def test_non_int_max_tokens_is_a_type_error(bad):
    with pytest.raises(TypeError, match=rf"max_tokens must be an int, got {bad!r}"):
        TokenBudget(bad)


@pytest.mark.parametrize("bad", ["pad", "PADDED", "sum", ""])
def test_unknown_cost_model_names_the_value_and_the_choices(bad):
    with pytest.raises(ValueError, match=rf"'padded', 'packed'.*got '{bad}'"):
        TokenBudget(100, cost_model=bad)


@pytest.mark.parametrize("bad", [0, -3])
def test_nonpositive_max_patches_names_the_value(bad):
    with pytest.raises(ValueError, match=rf"max_patches must be > 0, got {bad}"):
        TokenBudget(100, max_patches=bad)


def test_bool_max_patches_is_a_type_error():
    with pytest.raises(TypeError, match="max_patches must be an int, got True"):
        TokenBudget(100, max_patches=True)


def test_budget_is_frozen_and_hashable():
    budget = TokenBudget(100, "packed", 7)
    with pytest.raises(AttributeError):
        budget.max_tokens = 5
    assert hash(budget) == hash(TokenBudget(100, "packed", 7))


def test_padded_and_packed_costs():
    m = GroupMeasure().plus(7).plus(5).plus(3)  # n=3, max=7, sum=15
    assert m == GroupMeasure(n=3, max_len=7, sum_len=15, patches=0)
    padded, packed = TokenBudget(20), TokenBudget(20, cost_model="packed")
    assert padded.cost(m) == 21 and packed.cost(m) == 15
    assert not padded.fits(m) and packed.fits(m)
    assert padded.fill(m) == pytest.approx(21 / 20)
    assert packed.fill(m) == pytest.approx(15 / 20)
    assert padded.cost(GroupMeasure()) == packed.cost(GroupMeasure()) == 0


def test_equal_to_budget_fits_and_one_more_token_does_not():
    budget = TokenBudget(12)
    assert budget.fits(GroupMeasure().plus(4).plus(4).plus(4))
    assert not budget.admits(GroupMeasure().plus(4).plus(4).plus(4), 1)
    assert not budget.is_oversize(12) and budget.is_oversize(13)


def test_patch_budget_rejects_even_when_tokens_fit():
    budget = TokenBudget(1000, max_patches=10)
    m = GroupMeasure().plus(5, patches=6)
    assert budget.admits(m, 5, patches=4)
    assert not budget.admits(m, 5, patches=5)
    assert budget.is_oversize(1, patches=11)
    assert TokenBudget(1000).admits(m, 5, patches=10**6)  # no patch budget: ignored


def test_empty_group_admits_an_oversize_sample_but_not_a_second_one():
    budget = TokenBudget(8, max_patches=2)
    assert budget.admits(GroupMeasure(), 100, patches=100)
    lone = GroupMeasure().plus(100)
    assert budget.fill(lone) > 1
    assert not budget.admits(lone, 1)


budgets = st.builds(
    TokenBudget,
    max_tokens=st.integers(1, 200),
    cost_model=st.sampled_from(["padded", "packed"]),
    max_patches=st.none() | st.integers(1, 50),
)
samples = st.tuples(st.integers(1, 120), st.integers(0, 30))


def _measure(pairs):
    m = GroupMeasure()
    for length, patches in pairs:
        m = m.plus(length, patches)
    return m


@EXAMPLES
@given(budgets, st.lists(samples, max_size=8), samples)
def test_cost_is_monotone_so_subsets_of_fitting_groups_fit(budget, pairs, extra):
    m = _measure(pairs)
    bigger = m.plus(*extra)
    assert budget.cost(bigger) >= budget.cost(m)
    if budget.fits(bigger):
        assert budget.fits(m)


@EXAMPLES
@given(budgets, st.lists(samples, max_size=8), samples)
def test_admits_is_fits_of_plus_except_for_the_empty_group(budget, pairs, extra):
    m = _measure(pairs)
    expected = True if m.n == 0 else budget.fits(m.plus(*extra))
    assert budget.admits(m, *extra) == expected


@EXAMPLES
@given(budgets, st.lists(samples, min_size=1, max_size=8))
def test_measure_and_cost_agree_with_their_definitions(budget, pairs):
    m = _measure(pairs)
    lengths = [length for length, _ in pairs]
    assert (m.n, m.max_len, m.sum_len) == (len(pairs), max(lengths), sum(lengths))
    assert m.patches == sum(p for _, p in pairs)
    want = max(lengths) * len(lengths) if budget.cost_model == "padded" else sum(lengths)
    assert budget.cost(m) == want
    assert budget.fill(m) == want / budget.max_tokens


@EXAMPLES
@given(budgets, samples)
def test_is_oversize_means_a_lone_sample_does_not_fit(budget, sample):
    assert budget.is_oversize(*sample) == (not budget.fits(GroupMeasure().plus(*sample)))
