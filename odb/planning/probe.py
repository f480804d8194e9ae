"""The largest token budget a training step fits in memory, found by running it.

For a budget ``B`` the worst batches ODB can form are tried: as many copies of the
longest sample as the budget holds (the widest padding), and as many copies of the
shortest (the most samples). The user's own step function runs on each; a budget fits
when neither raises an out-of-memory error. Memory grows with the budget, so the search
bisects a grid of budgets ``step, 2*step, ...`` and ends within one step of the limit.
A ``headroom`` share is then kept free: the safe budget is the largest grid budget at
most ``(1 - headroom)`` times the limit found.

Only CUDA memory is probed: on CPU an allocation past the memory limit is not an error a
step raises (the kernel's OOM killer ends the process), and CPU memory is not what a GPU
run is limited by, so :func:`odb.plan` says it cannot probe there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from odb.collate import PadCollate
from odb.core.checks import check_callables, check_int

StepFn = Callable[[Any], Any]
NO_CUDA = (
    "no CUDA device: the probe measures GPU memory, and on CPU an allocation past the "
    "limit is not an error a step raises; run odb.plan with probe= on the training machine"
)


@dataclass(frozen=True)
class MemoryProbe:
    """Your training step and how to search with it.

    Attributes:
        step_fn: One training step on a collated batch (forward, backward, optimizer),
            as in your loop; called on the worst batches of each budget tried.
        collate_fn: Builds the batch from samples; default :class:`odb.PadCollate`.
        step: The search's resolution in tokens.
        headroom: Share of the limit found that is kept free, in ``[0, 1)``.
    """

    step_fn: StepFn
    collate_fn: Callable[[list[Any]], Any] | None = None
    step: int = 1024
    headroom: float = 0.1

    def __post_init__(self) -> None:
        check_callables(step_fn=self.step_fn, collate_fn=self.collate_fn)
        check_int("MemoryProbe.step", self.step, 1)
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom is a share of memory in [0, 1), got {self.headroom}")

    @classmethod
    def of(cls, probe: MemoryProbe | StepFn | None) -> MemoryProbe | None:
        """``probe=`` of :func:`odb.plan`: a step function gets the default settings."""
        if probe is None or isinstance(probe, MemoryProbe):
            return probe
        return cls(probe)

    def search(
        self, longest: Any, longest_len: int, shortest: Any, shortest_len: int, max_budget: int
    ) -> ProbeResult:
        """Search on CUDA with the worst batches of these two samples."""

        def batches_for(budget: int) -> list[tuple[list[Any], int]]:
            return worst_batches(longest, longest_len, shortest, shortest_len, budget)

        collate = self.collate_fn or PadCollate()
        run_budget = run_on_cuda(self.step_fn, collate, batches_for)
        return search_budget(run_budget, step=self.step, max_budget=max_budget,
                             headroom=self.headroom)  # fmt: skip


@dataclass
class ProbeResult:
    """The search's outcome and every try (budget, fits, seconds of the batches, tokens)."""

    limit: int | None
    safe_budget: int | None
    headroom: float
    tries: list[dict[str, Any]] = field(default_factory=list)


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError)


def worst_batches(
    longest: Any, longest_len: int, shortest: Any, shortest_len: int, budget: int
) -> list[tuple[list[Any], int]]:
    """The samples of the two worst batches under ``budget``, with their padded tokens."""
    wide = max(1, budget // longest_len)
    many = max(1, budget // shortest_len)
    return [([longest] * wide, wide * longest_len), ([shortest] * many, many * shortest_len)]


def search_budget(
    run_budget: Callable[[int], list[tuple[float, int]]],
    *,
    step: int,
    max_budget: int,
    headroom: float = 0.1,
) -> ProbeResult:
    """Bisect ``step, 2*step, ..., max_budget`` for the largest budget that fits.

    Args:
        run_budget: Runs the worst batches of one budget; returns ``(seconds, tokens)``
            of each, or raises an out-of-memory error (``is_out_of_memory``).
        step: The grid's spacing in tokens (the search's resolution).
        max_budget: The largest budget tried.
        headroom: Share of the limit kept free, in ``[0, 1)``.
    """
    if step <= 0 or max_budget < step:
        raise ValueError(f"need 0 < step <= max_budget, got step={step}, max={max_budget}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom is a share in [0, 1), got {headroom}")
    grid = list(range(step, max_budget + 1, step))
    result = ProbeResult(None, None, headroom)
    low, high = -1, len(grid)  # grid[low] fits (or none yet), grid[high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if _fits(run_budget, grid[mid], result.tries):
            low = mid
        else:
            high = mid
    if low >= 0:
        result.limit = grid[low]
        safe = [b for b in grid if b <= (1 - headroom) * grid[low]]
        result.safe_budget = safe[-1] if safe else None
    return result


def _fits(run_budget: Callable[[int], list[tuple[float, int]]], budget: int, tries: list) -> bool:
    try:
        timings = run_budget(budget)
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        tries.append({"budget": budget, "fits": False})
        return False
    tries.append({"budget": budget, "fits": True, "timings": [list(t) for t in timings]})
    return True


def run_on_cuda(
    step_fn: StepFn,
    collate: Callable[[list[Any]], Any],
    batches_for: Callable[[int], Sequence[tuple[list[Any], int]]],
) -> Callable[[int], list[tuple[float, int]]]:
    """``run_budget`` for :func:`search_budget`: each worst batch collated, run, timed;
    after an out-of-memory error the allocator's cache is emptied."""

    def run_budget(budget: int) -> list[tuple[float, int]]:
        timings = []
        try:
            for samples, tokens in batches_for(budget):
                batch = collate(samples)
                torch.cuda.synchronize()
                start = time.perf_counter()
                step_fn(batch)
                torch.cuda.synchronize()
                timings.append((time.perf_counter() - start, tokens))
        except Exception:
            torch.cuda.empty_cache()
            raise
        return timings

    return run_budget


def fit_step_cost(tries: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """Least-squares ``seconds = a + b * tokens`` over the probe's timed batches; None
    with fewer than two distinct token counts (or a fit with ``b <= 0``)."""
    points = [(tokens, seconds) for t in tries if t["fits"] for seconds, tokens in t["timings"]]
    if len({tokens for tokens, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    if b <= 0:
        return None
    return max(0.0, mean_y - b * mean_x), b
