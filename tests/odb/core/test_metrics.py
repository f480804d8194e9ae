"""Tests for odb.core.metrics: one definition of each figure, for ODB and the baselines."""

from __future__ import annotations

import pytest

from odb.core.alignment import RankStatus
from odb.core.budget import GroupMeasure, TokenBudget
from odb.core.metrics import EpochMetrics, StepMetrics


def measure(*lengths: int, patches: int = 0) -> GroupMeasure:
    m = GroupMeasure()
    for length in lengths:
        m = m.plus(length, patches)
    return m


def test_padded_tokens_are_the_cost_models_price():
    padded, packed = StepMetrics(), StepMetrics()
    for lengths in [(6, 4), (5, 5, 5), (3,)]:
        padded.record_step(TokenBudget(16), measure(*lengths))
        packed.record_step(TokenBudget(16, "packed"), measure(*lengths))
    assert padded.real_tokens == packed.real_tokens == 28
    assert padded.padded_tokens == 12 + 15 + 3  # max_len * n per step
    assert packed.padded_tokens == 28  # a packed row has no padding
    assert padded.summary()["padding_efficiency"] == pytest.approx(28 / 30)
    assert packed.summary()["padding_efficiency"] == 1.0


def test_oversize_and_budget_violations_are_told_apart():
    m = StepMetrics()
    budget = TokenBudget(10, max_patches=4)
    m.record_step(budget, measure(12))  # a lone sample over budget
    m.record_step(budget, measure(6, 6))  # a multi-sample step over budget
    m.record_step(budget, measure(3, 3, patches=3))  # over the patch budget
    m.record_step(budget, measure(5, 5))  # exactly full
    assert (m.oversize, m.budget_violations) == (1, 2)
    assert m.max_violation_fill == pytest.approx(1.2)
    s = m.summary()
    assert s["budget_fill"] == pytest.approx((1.2 + 1.2 + 0.6 + 1.0) / 4)
    assert (s["max_group_size"], s["mean_group_size"]) == (2, 7 / 4)


def test_idle_steps_count_as_steps_without_samples():
    m = StepMetrics()
    m.record_idle()
    s = m.summary()
    assert (s["steps"], s["idle_steps"], s["samples"], s["idle_fraction"]) == (1, 1, 0, 1.0)
    assert (s["padding_efficiency"], s["budget_fill"], s["mean_group_size"]) == (1.0, 0.0, 0.0)
    m.record_step(TokenBudget(8), measure(4, 2))
    assert m.summary()["idle_fraction"] == 0.5


def test_epoch_metrics_summary_adds_the_rounds_and_reports_no_histogram():
    m = EpochMetrics(rounds=4, align_seconds=0.01)
    s = m.summary()
    assert s["mean_round_ms"] == pytest.approx(2.5)
    assert "fill_sum" not in s and "group_sizes" not in s
    assert set(StepMetrics().summary()) < set(s)


def test_record_tail_counts_rounds_after_every_rank_read_its_view():
    m = EpochMetrics()
    reading = RankStatus(ready=1, buffered=5, read_done=False, read_count=3, free_slots=1)
    done = RankStatus(ready=1, buffered=7, read_done=True, read_count=9, free_slots=1)
    m.record_tail([reading, done], end=False)
    m.record_tail([done, done], end=False)
    m.record_tail([done, done], end=False)
    m.record_tail([done, done], end=True)
    assert (m.tail_rounds, m.tail_start_buffered) == (2, 7)
