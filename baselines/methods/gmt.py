"""GMT: greedy max-token groups over the globally sorted length cache.

The groups are :func:`odb.kit.form_groups` over the sorted pool (the same cost seam as
ODB's), shuffled and dealt round-robin; ranks are IDLE-padded when the groups do not
divide over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import odb
import odb.kit
from baselines.plans import Plan, StepIds, deal, shuffled, sized_samples
from baselines.sizing import TokenBudgetedLoader

__all__ = ["GMTLoader", "GMTPlan"]


@dataclass(frozen=True)
class GMTPlan:
    """Greedy token-budget groups over the sorted pool, shuffled, dealt round-robin.

    Example:
        >>> GMTPlan(odb.TokenBudget(8), lengths=(4, 4, 2, 2, 8), shuffle=False)(
        ...     range(5), world_size=2, seed=0)
        [[(4,), (2, 3)], [(0, 1), ()]]
    """

    budget: odb.TokenBudget
    lengths: Sequence[int] = field(repr=False)
    patches: Sequence[int] | None = field(default=None, repr=False)
    shuffle: bool = True

    def groups(self, pool: Sequence[int]) -> list[StepIds]:
        """The groups, longest first (before shuffling)."""
        return [
            g.keys
            for g in odb.kit.form_groups(
                sized_samples(pool, self.lengths, self.patches), self.budget
            )
        ]

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return deal(shuffled(self.groups(pool), seed, self.shuffle), world_size)


class GMTLoader(TokenBudgetedLoader):
    """Greedy max-token groups over the globally sorted length cache, shuffled and dealt."""

    method = "gmt"

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        planner = GMTPlan(self.budget, self.lengths, self.patches, self.config.shuffle)
        return planner(pool, world_size, seed)
