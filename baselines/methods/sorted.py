"""Sorted: fixed batches over the length-sorted pool, ``W`` adjacent batches per step.

Lengths come from a length cache, a list, or a pre-pipeline proxy ``f(index)`` (e.g. text
length plus nominal image tokens); the last step is IDLE-padded when it has fewer than
``W`` batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from baselines.plans import Plan, check_world, chunks, deal_steps, shuffled
from baselines.sizing import FixedBatchLoader

__all__ = ["SortedLoader", "SortedPlan"]


@dataclass(frozen=True)
class SortedPlan:
    """Fixed batches over the length-sorted pool; ``W`` adjacent batches per step.

    Why this order: a global sort is the least padding a fixed batch size can reach;
    putting adjacent batches on the ranks of one step keeps the ranks' step times alike;
    shuffling the steps (seeded, per epoch) avoids a length curriculum (a monotone
    length order biases the loss curve and its interplay with the LR schedule). With
    ``shuffle=False`` the order is longest first, which surfaces an OOM at step 0.

    Example:
        >>> SortedPlan(batch_size=2, lengths=(5, 1, 4, 2, 3), shuffle=False)(
        ...     [0, 1, 2, 3, 4], world_size=2, seed=0)
        [[(0, 2), (1,)], [(4, 3), ()]]
    """

    batch_size: int
    lengths: Sequence[int] = field(repr=False)
    shuffle: bool = True

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        check_world(world_size)
        order = sorted(pool, key=lambda i: -self.lengths[i])  # stable: ties keep pool order
        batches = chunks(order, self.batch_size)
        steps = [batches[j : j + world_size] for j in range(0, len(batches), world_size)]
        return deal_steps(shuffled(steps, seed, self.shuffle), world_size)


class SortedLoader(FixedBatchLoader):
    """Fixed batches over a length-sorted order; see :class:`baselines.plans.SortedPlan`.

    Lengths come from a length cache, a list, or a pre-pipeline proxy ``f(index)`` (e.g.
    text length plus nominal image tokens).
    """

    method = "sorted"

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        return SortedPlan(self.batch_size, self.lengths, self.config.shuffle)(
            pool, world_size, seed
        )
