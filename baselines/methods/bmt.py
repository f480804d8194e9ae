"""BMT: GMT's groups balanced per step: ``W`` groups of similar cost, snake-dealt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import odb
import odb.kit
from baselines.plans import Plan, check_world, deal_steps, shuffled, sized_samples
from baselines.sizing import TokenBudgetedLoader

__all__ = ["BMTLoader", "BMTPlan"]


@dataclass(frozen=True)
class BMTPlan:
    """GMT's groups, balanced per step: ``W`` groups of similar cost, snake-dealt.

    The cost of a group is ``budget.cost`` (the one cost seam), so balancing follows
    the same notion of load as the budget itself.

    Example:
        >>> BMTPlan(odb.TokenBudget(8), lengths=(8, 4, 4, 3, 3, 2, 1), shuffle=False)(
        ...     range(7), world_size=2, seed=0)
        [[(0,), (5, 6)], [(1, 2), (3, 4)]]
    """

    budget: odb.TokenBudget
    lengths: Sequence[int] = field(repr=False)
    patches: Sequence[int] | None = field(default=None, repr=False)
    shuffle: bool = True

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        check_world(world_size)
        groups = odb.kit.form_groups(sized_samples(pool, self.lengths, self.patches), self.budget)
        groups.sort(key=lambda g: (-self.budget.cost(g.measure), min(g.keys)))
        steps = []
        for j, start in enumerate(range(0, len(groups), world_size)):
            step = [g.keys for g in groups[start : start + world_size]]
            # Snake order: the heaviest group of a step goes to rank 0 on even steps and
            # to the last rank on odd ones, so per-rank totals stay balanced too.
            if j % 2:
                step = [()] * (world_size - len(step)) + step[::-1]
            steps.append(step)
        return deal_steps(shuffled(steps, seed, self.shuffle), world_size)


class BMTLoader(TokenBudgetedLoader):
    """GMT's groups with balanced per-step load across ranks (similar cost, snake order)."""

    method = "bmt"

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        planner = BMTPlan(self.budget, self.lengths, self.patches, self.config.shuffle)
        return planner(pool, world_size, seed)
