"""Standard: shuffled fixed batches, the largest that never exceed the budget by default.

No lengths are needed: rank ``r`` reads its round-robin share of the seeded epoch order
(``odb.core.sharding.rank_view`` on a fresh epoch) in batches of ``batch_size``, else
``token_budget // cutoff_len``; a rank whose share needs one batch fewer ends with an
IDLE step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baselines.plans import Plan, check_world, chunks
from baselines.sizing import FixedBatchLoader

__all__ = ["StandardLoader", "StandardPlan"]


@dataclass(frozen=True)
class StandardPlan:
    """Fixed batches of ``batch_size`` over each rank's round-robin share of the pool.

    Example:
        >>> StandardPlan(batch_size=2)([4, 0, 3, 1, 2], world_size=2, seed=0)
        [[(4, 3), (2,)], [(0, 1), ()]]
    """

    batch_size: int
    shuffle: bool = True  # accepted for a uniform signature; the pool is already ordered

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        check_world(world_size)
        views = [list(pool[r::world_size]) for r in range(world_size)]
        per_rank = [chunks(view, self.batch_size) for view in views]
        steps = max(len(batches) for batches in per_rank)
        return [batches + [()] * (steps - len(batches)) for batches in per_rank]


class StandardLoader(FixedBatchLoader):
    """Shuffled fixed batches: by default the largest that never exceeds the budget.

    The batch size is ``config.batch_size``, else ``token_budget // cutoff_len``. Rank
    ``r`` reads ``odb.core.sharding.rank_view`` (the seeded shuffle dealt round-robin) in
    batches; a rank whose view needs one batch fewer ends with an IDLE step.
    """

    method = "standard"
    needs_lengths = False

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return StandardPlan(self.batch_size)(pool, world_size, seed)
