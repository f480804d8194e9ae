"""What one epoch looks like under ODB, the fixed-batch Standard and the offline oracle.

For each candidate token budget and world size, the epoch is simulated with the loader's
own round protocol (:func:`odb.planning.simulate.simulate`, the views the loader deals)
over the measured lengths. Its time is estimated with a step-cost model
``t(step) = a + b * tokens``: ranks step together, so a step takes as long as its
costliest rank's, and an IDLE step costs ``a``. Tokens are a step's cost under the
budget's cost model (padded: longest x samples; packed: summed lengths).

The fixed-batch Standard at a cutoff ``C`` takes ``max(1, budget // C)`` samples a step
(the largest batch that fits the budget whatever the lengths) from the same views,
padded to its longest sample; the oracle sorts every sample globally, groups greedily
under the budget and deals the groups round-robin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import zip_longest

from odb.core.budget import GroupMeasure, TokenBudget
from odb.core.config import ODBConfig
from odb.core.grouping import SizedSample, form_groups
from odb.planning.model_forecast import model_epochs
from odb.planning.simulate import round_robin_views, simulate, summarize
from odb.planning.step_cost import StepModel

DEFAULT_FIXED_TOKENS = 1000


@dataclass(frozen=True)
class StepCost:
    """``t(step) = a + b * tokens``: ``a`` a step's fixed cost (optimizer step, gradient
    all-reduce, launches), ``b`` the cost of one token of the step's cost; any unit
    (speed-ups are ratios). The default is in token units: a step's fixed cost is the
    work of ``DEFAULT_FIXED_TOKENS`` tokens, an estimate for fine-tuning a
    multi-billion-parameter model on current GPUs (``docs/plan.md``); measure yours with
    ``odb.plan(..., probe=step)`` on the GPU, or give it. ``StepCost(0, 1)`` counts
    tokens only (padding waste alone)."""

    a: float = float(DEFAULT_FIXED_TOKENS)
    b: float = 1.0

    def __post_init__(self) -> None:
        if not (self.a >= 0 and self.b > 0):
            raise ValueError(
                f"StepCost needs a >= 0 and b > 0, got a={self.a}, b={self.b}; "
                "a is seconds per step, b seconds per token"
            )

    def epoch_seconds(self, rank_costs: Sequence[Sequence[int]]) -> float:
        """Ranks step together: step ``k`` takes its costliest rank's time."""
        steps = zip_longest(*rank_costs, fillvalue=0)
        return sum(self.a + self.b * max(step) for step in steps)


def padded_cost(lengths: Sequence[int]) -> int:
    return max(lengths) * len(lengths)


def standard_costs(
    lengths: Sequence[int], budget: int, cutoff: int, world_size: int, config: ODBConfig
) -> list[list[int]]:
    """Every rank's step costs under the fixed-batch Standard (padded to the longest)."""
    size = max(1, budget // cutoff)
    views = round_robin_views(len(lengths), world_size, config.seed, 0, config.shuffle)
    return [
        [padded_cost([lengths[i] for i in view[k : k + size]]) for k in range(0, len(view), size)]
        for view in views
    ]


def oracle_costs(lengths: Sequence[int], budget: TokenBudget, world_size: int) -> list[list[int]]:
    """Every rank's step costs when globally sorted groups are dealt round-robin."""
    items = [SizedSample(i, int(n)) for i, n in enumerate(lengths)]
    groups = form_groups(items, budget)
    costs = [budget.cost(GroupMeasure.of(it.length for it in g.items)) for g in groups]
    return [costs[rank::world_size] for rank in range(world_size)]


def forecast_row(
    lengths: Sequence[int],
    config: ODBConfig,
    world_size: int,
    *,
    cutoff: int,
    step_cost: StepCost | StepModel,
    nbytes: Sequence[int] | None = None,
    patches: Sequence[int] | None = None,
) -> dict[str, float | int]:
    """One budget x world size: ODB's epoch against Standard's and the oracle's (times in
    ``step_cost``'s units; seconds under a :class:`~odb.planning.step_cost.StepModel`)."""
    sim = simulate(
        lengths, config, world_size=world_size, sample_bytes=nbytes, sample_patches=patches
    )
    odb = summarize(sim)  # over every rank: the loader's stats() summed
    budget = config.budget
    standard = standard_costs(lengths, config.token_budget, cutoff, world_size, config)
    oracle = oracle_costs(lengths, budget, world_size)
    if isinstance(step_cost, StepModel):
        odb_s, standard_s, oracle_s = model_epochs(step_cost, sim, lengths, patches, cutoff)
    else:
        odb_s = step_cost.epoch_seconds([r.costs for r in sim.ranks])
        standard_s = step_cost.epoch_seconds(standard)
        oracle_s = step_cost.epoch_seconds(oracle)
    real_steps = odb["steps"] * world_size - odb["idle_steps"]
    real_tokens = sum(sum(group) for rank in sim.ranks for group in rank.groups)
    padded_tokens = sum(sum(rank.costs) for rank in sim.ranks)
    return {
        "budget": config.token_budget,
        "world_size": world_size,
        "steps": odb["steps"],
        "idle_steps": odb["idle_steps"],
        "real_tokens": real_tokens,
        "padded_tokens": padded_tokens,
        "padding_efficiency": round(real_tokens / padded_tokens, 4) if padded_tokens else 1.0,
        "idle_fraction": odb["idle_fraction"],
        "samples_per_step": round(len(lengths) / real_steps, 2) if real_steps else 0.0,
        "oversize": sum(1 for n in lengths if budget.is_oversize(n)),
        "standard_batch_size": max(1, config.token_budget // cutoff),
        "standard_steps": max(len(r) for r in standard),
        "standard_padding_efficiency": _efficiency(lengths, standard),
        "oracle_steps": max(len(r) for r in oracle),
        "oracle_padding_efficiency": _oracle_efficiency(lengths, budget),
        "epoch_cost": round(odb_s, 6),
        "standard_epoch_cost": round(standard_s, 6),
        "oracle_epoch_cost": round(oracle_s, 6),
        "speedup_vs_standard": round(standard_s / odb_s, 4) if odb_s else 0.0,
    }


def _efficiency(lengths: Sequence[int], rank_costs: Sequence[Sequence[int]]) -> float:
    padded = sum(sum(costs) for costs in rank_costs)
    return round(sum(lengths) / padded, 4) if padded else 1.0


def _oracle_efficiency(lengths: Sequence[int], budget: TokenBudget) -> float:
    padded_budget = replace(budget, cost_model="padded")
    return _efficiency(lengths, oracle_costs(lengths, padded_budget, 1))


def length_stats(lengths: Sequence[int], short_threshold: int, cutoff: int) -> dict[str, float]:
    """Mean, CV, the share of short samples, percentiles and the share over the cutoff."""
    ordered = sorted(lengths)
    n = len(ordered)
    mean = sum(ordered) / n
    variance = sum((x - mean) ** 2 for x in ordered) / n
    return {
        "samples": n,
        "mean": round(mean, 2),
        "cv": round(variance**0.5 / mean, 4),
        "short_threshold": short_threshold,
        "short_fraction": round(sum(1 for x in ordered if x < short_threshold) / n, 4),
        "p50": _percentile(ordered, 0.50),
        "p90": _percentile(ordered, 0.90),
        "p99": _percentile(ordered, 0.99),
        "max": ordered[-1],
        "cutoff": cutoff,
        "over_cutoff_fraction": round(sum(1 for x in ordered if x > cutoff) / n, 4),
    }


def _percentile(ordered: Sequence[int], q: float) -> int:
    """The nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(q * len(ordered)))
    return int(ordered[min(rank, len(ordered)) - 1])
