"""Tests for odb.core.loss: loss-token counting and the gradient-accumulation window normalizer.

The exactness check rebuilds, in float64, what W DDP ranks compute (each rank sums its
token losses and divides by the step's normalizer; DDP averages over ranks; micro-steps
of a window accumulate) and compares it with one process taking the per-token mean over
the union of every rank's tokens in the window: values and gradients, to 1e-12.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.core.loss import AccumulationNormalizer, count_loss_tokens

EXAMPLES = settings(max_examples=200, deadline=None)


# ---------------------------------------------------------------- count_loss_tokens


def test_count_loss_tokens_shift_on_and_off():
    labels = torch.tensor([[5, -100, 7, 8], [-100, -100, 3, -100]])
    batch = {"input_ids": torch.zeros(2, 4), "labels": labels}
    assert count_loss_tokens(batch, "labels", -100, shift=False) == 4
    # The causal shift drops position 0 of every row: row 0 loses its 5.
    assert count_loss_tokens(batch, "labels", -100, shift=True) == 3
    assert type(count_loss_tokens(batch, "labels", -100, shift=True)) is int


@EXAMPLES
@given(st.integers(1, 4), st.integers(1, 9), st.integers(-3, 3), st.data())
def test_count_loss_tokens_matches_a_plain_count(rows, cols, ignore, data):
    values = data.draw(st.lists(st.integers(-3, 3), min_size=rows * cols,
                                max_size=rows * cols))
    labels = torch.tensor(values).reshape(rows, cols)
    grid = [values[r * cols:(r + 1) * cols] for r in range(rows)]
    batch = {"y": labels}
    assert count_loss_tokens(batch, "y", ignore, shift=False) == sum(
        v != ignore for row in grid for v in row)
    assert count_loss_tokens(batch, "y", ignore, shift=True) == sum(
        v != ignore for row in grid for v in row[1:])


def test_count_loss_tokens_all_masked_is_zero():
    batch = {"labels": torch.full((1, 6), -100)}
    assert count_loss_tokens(batch, "labels", -100, shift=True) == 0
    assert count_loss_tokens(batch, "labels", -100, shift=False) == 0


def test_count_loss_tokens_missing_key_names_it():
    batch = {"input_ids": torch.zeros(1, 3), "target": torch.zeros(1, 3)}
    with pytest.raises(ValueError, match="'labels'") as err:
        count_loss_tokens(batch, "labels", -100, shift=True)
    assert "input_ids" in str(err.value) and "target" in str(err.value)


# ---------------------------------------------------------------- AccumulationNormalizer


def test_window_releases_whole_windows_with_one_total():
    w = AccumulationNormalizer(window=3, world_size=2)
    assert w.push("a", 10) == [] and w.push("b", 0) == [] and w.held == 2
    released = w.push("c", 5)
    assert released == [("a", 15, 7.5), ("b", 15, 7.5), ("c", 15, 7.5)]
    assert w.held == 0
    assert w.push("d", 4) == [] and w.held == 1


def test_window_flush_releases_a_short_last_window():
    w = AccumulationNormalizer(window=4, world_size=4)
    for item, tokens in [("a", 3), ("b", 5)]:
        assert w.push(item, tokens) == []
    assert w.flush() == [("a", 8, 2.0), ("b", 8, 2.0)]
    assert w.held == 0 and w.flush() == []


def test_window_of_one_releases_each_step():
    w = AccumulationNormalizer(window=1, world_size=3)
    assert w.push("a", 6) == [("a", 6, 2.0)]
    assert w.push("b", 0) == [("b", 0, 1 / 3)]


@pytest.mark.parametrize("world", [1, 2, 8])
def test_zero_token_window_gets_one_over_world(world):
    w = AccumulationNormalizer(window=2, world_size=world)
    w.push("idle", 0)
    released = w.push("idle2", 0)
    assert [n for _, _, n in released] == [1 / world, 1 / world]
    assert all(t == 0 for _, t, _ in released)
    assert all(n > 0 and math.isfinite(n) for _, _, n in released)
    # Flushing a zero-token short window too.
    w.push("idle3", 0)
    [(_, tokens, normalizer)] = w.flush()
    assert tokens == 0 and normalizer == 1 / world


@EXAMPLES
@given(st.integers(1, 5), st.integers(1, 4), st.lists(st.integers(0, 50), max_size=30))
def test_window_partition_of_a_stream(window, world, tokens):
    w = AccumulationNormalizer(window, world)
    out = []
    for step, t in enumerate(tokens):
        out += w.push(step, t)
        assert w.held == (step + 1) % window
    out += w.flush()
    assert [item for item, _, _ in out] == list(range(len(tokens)))  # in order, once each
    for k in range(0, len(tokens), window):
        chunk = out[k:k + window]
        total = sum(tokens[k:k + window])
        assert {t for _, t, _ in chunk} == {total}
        assert {n for _, _, n in chunk} == {max(total, 1) / world}


# ---------------------------------------------------------------- exactness


@st.composite
def partitions(draw):
    """Per window, per micro-step, per rank: the number of loss tokens (0 = IDLE/masked)."""
    world = draw(st.integers(1, 4))
    window = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 9))
    tokens = draw(st.lists(st.lists(st.integers(0, 6) | st.just(0), min_size=world,
                                    max_size=world), min_size=steps, max_size=steps))
    seed = draw(st.integers(0, 2**31 - 1))
    return world, window, tokens, seed


@settings(max_examples=300, deadline=None)
@given(partitions())
def test_normalizer_gives_the_global_per_token_mean(case):
    world, window, tokens, seed = case
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(3, dtype=torch.float64, generator=gen)
    # Token t of rank r at step s has features x and target y; its loss is (w.x - y)^2.
    feats = [[torch.randn(n, 3, dtype=torch.float64, generator=gen) for n in row]
             for row in tokens]
    targets = [[torch.randn(n, dtype=torch.float64, generator=gen) for n in row]
               for row in tokens]

    def token_losses(w, s, r):
        return (feats[s][r] @ w - targets[s][r]) ** 2

    norm = AccumulationNormalizer(window, world)
    normalizers = {}
    for s, row in enumerate(tokens):
        for step, _, n in norm.push(s, sum(row)):
            normalizers[step] = n
    for step, _, n in norm.flush():
        normalizers[step] = n
    assert sorted(normalizers) == list(range(len(tokens)))

    for start in range(0, len(tokens), window):
        steps = range(start, min(start + window, len(tokens)))
        # W ranks: each accumulates sum(token losses) / normalizer over the window's
        # micro-steps; DDP then averages the gradients (and here the values) over ranks.
        ddp_value, ddp_grad = 0.0, torch.zeros(3, dtype=torch.float64)
        for r in range(world):
            w = weight.clone().requires_grad_(True)
            local = sum((token_losses(w, s, r).sum() / normalizers[s] for s in steps),
                        torch.zeros((), dtype=torch.float64))
            if local.requires_grad:
                (grad,) = torch.autograd.grad(local, w)
            else:
                grad = torch.zeros(3, dtype=torch.float64)
            ddp_value += local.item() / world
            ddp_grad += grad / world
        # One process over the union of every rank's tokens of the window.
        w = weight.clone().requires_grad_(True)
        all_losses = torch.cat([token_losses(w, s, r) for s in steps for r in range(world)])
        if all_losses.numel() == 0:
            assert ddp_value == 0.0 and torch.count_nonzero(ddp_grad) == 0
            assert all(normalizers[s] == 1 / world for s in steps)
            continue
        mean = all_losses.mean()
        (ref_grad,) = torch.autograd.grad(mean, w)
        assert math.isclose(ddp_value, mean.item(), rel_tol=1e-12, abs_tol=1e-12)
        assert torch.allclose(ddp_grad, ref_grad, rtol=1e-12, atol=1e-12)
