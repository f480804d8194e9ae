"""The memory probe's search, on CPU with a step that raises out-of-memory at a known
token count (the search is the same whatever raises)."""

from __future__ import annotations

import pytest
import torch

from odb.planning.probe import MemoryProbe, fit_step_cost, search_budget, worst_batches

LONGEST, SHORTEST = 3000, 10


def fake_device(limit_tokens: int, calls: list[int] | None = None):
    """``run_budget`` for a device that runs out of memory past ``limit_tokens`` tokens."""

    def run_budget(budget: int) -> list[tuple[float, int]]:
        if calls is not None:
            calls.append(budget)
        timings = []
        for samples, tokens in worst_batches("long", LONGEST, "short", SHORTEST, budget):
            assert tokens <= budget or len(samples) == 1  # a batch never exceeds its budget
            if tokens > limit_tokens:
                raise torch.OutOfMemoryError(f"CUDA out of memory at {tokens} tokens (fake)")
            timings.append((0.002 + 1e-6 * tokens, tokens))
        return timings

    return run_budget


@pytest.mark.parametrize("limit", [5000, 20_480, 61_000, 131_071])
def test_the_search_finds_the_limit_within_one_step(limit: int) -> None:
    calls: list[int] = []
    result = search_budget(fake_device(limit, calls), step=1024, max_budget=262_144)
    assert result.limit is not None and abs(result.limit - limit) <= 1024
    assert len(calls) <= 9  # bisection: log2(256 grid budgets) + 1 tries
    assert result.safe_budget is not None and result.safe_budget <= 0.9 * result.limit
    assert result.safe_budget > 0.9 * result.limit - 1024


def test_nothing_fits_and_everything_fits() -> None:
    assert search_budget(fake_device(500), step=1024, max_budget=8192).limit is None
    everything = search_budget(fake_device(10**9), step=1024, max_budget=8192, headroom=0)
    assert (everything.limit, everything.safe_budget) == (8192, 8192)


def test_an_error_that_is_not_out_of_memory_is_raised() -> None:
    def broken(budget: int) -> list[tuple[float, int]]:
        raise KeyError("labels")

    with pytest.raises(KeyError, match="labels"):
        search_budget(broken, step=1024, max_budget=8192)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"step": 0, "max_budget": 10}, "step"),
        ({"step": 64, "max_budget": 10}, "step"),
        ({"step": 1, "max_budget": 10, "headroom": 1.5}, "headroom"),
    ],
)
def test_bad_search_settings_are_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        search_budget(fake_device(100), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"headroom": 1.0}, ValueError, "headroom is a share"),
        ({"step": 0}, ValueError, "step"),
        ({"collate_fn": "pad"}, TypeError, "collate_fn"),
    ],
)
def test_a_bad_memory_probe_is_refused(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        MemoryProbe(print, **kwargs)


def test_the_step_cost_is_fitted_from_the_timed_batches() -> None:
    result = search_budget(fake_device(40_000), step=1024, max_budget=65_536)
    a, b = fit_step_cost(result.tries)
    assert a == pytest.approx(0.002, rel=1e-6) and b == pytest.approx(1e-6, rel=1e-6)
    assert fit_step_cost([{"fits": True, "timings": [[0.1, 50]]}]) is None  # one point
