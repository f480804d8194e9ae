"""The five baseline loaders: each is :class:`~baselines.loader.PlannedLoader` plus a plan.

=========== ============================== ====================== ======================
method      batches                        lengths from           IDLE steps when
=========== ============================== ====================== ======================
standard    fixed size, shuffled           none                   a rank's view needs
                                                                  one batch fewer
sorted      fixed size, length-sorted      cache or proxy         the last step has < W
                                                                  batches
gmt         greedy token-budget groups     length cache           groups % W != 0
bmt         gmt, balanced per step         length cache           groups % W != 0
packing     concatenated rows (text only)  length cache           rows % W != 0
=========== ============================== ====================== ======================

No method drops a sample: every sample is in exactly one step per epoch, and the ranks
that are one step short get an IDLE step (see :mod:`baselines.plans`).

Example:
    >>> from baselines import BaselineConfig, GMTLoader, LengthCache
    >>> cache = LengthCache.load("results/cache/ultrachat.json", dataset)  # doctest: +SKIP
    >>> loader = GMTLoader(dataset, BaselineConfig(token_budget=8192),
    ...                    lengths=cache)                                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from baselines.loader import PlannedLoader
from baselines.packing import PackCollate
from baselines.plans import BMTPlan, GMTPlan, PackingPlan, Plan, SortedPlan, StandardPlan

__all__ = ["BMTLoader", "GMTLoader", "PackingLoader", "SortedLoader", "StandardLoader"]


class _FixedBatch(PlannedLoader):
    def _setup(self) -> None:
        self.batch_size = self.config.fixed_batch_size()

    def _plan_params(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "shuffle": self.config.shuffle}


class _TokenBudgeted(PlannedLoader):
    def _setup(self) -> None:
        for name in ("batch_size", "cutoff_len"):
            if getattr(self.config, name) is not None:
                raise ValueError(
                    f"{name}={getattr(self.config, name)} has no meaning for the "
                    f"{self.method!r} method, whose groups are sized by token_budget; "
                    f"leave {name}=None"
                )

    def _plan_params(self) -> dict[str, Any]:
        return {"shuffle": self.config.shuffle}


class StandardLoader(_FixedBatch):
    """Shuffled fixed batches: by default the largest that never exceeds the budget.

    The batch size is ``config.batch_size``, else ``token_budget // cutoff_len``. Rank
    ``r`` reads ``odb.core.sharding.rank_view`` (the seeded shuffle dealt round-robin) in
    batches; a rank whose view needs one batch fewer ends with an IDLE step.
    """

    method = "standard"
    needs_lengths = False

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return StandardPlan(self.batch_size)(pool, world_size, seed)


class SortedLoader(_FixedBatch):
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


class GMTLoader(_TokenBudgeted):
    """Greedy max-token groups over the globally sorted length cache, shuffled and dealt."""

    method = "gmt"

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        planner = GMTPlan(self.budget, self.lengths, self.patches, self.config.shuffle)
        return planner(pool, world_size, seed)


class BMTLoader(_TokenBudgeted):
    """GMT's groups with balanced per-step load across ranks (similar cost, snake order)."""

    method = "bmt"

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        planner = BMTPlan(self.budget, self.lengths, self.patches, self.config.shuffle)
        return planner(pool, world_size, seed)


class PackingLoader(_TokenBudgeted):
    """Text-only packed rows of up to ``token_budget`` tokens (batch size 1 per rank).

    The default collate is :class:`baselines.packing.PackCollate` (restarted
    ``position_ids``, block-causal 4-D mask, first label of each sample masked). The
    budget's cost model is ``"packed"``; a ``"padded"`` one is refused.
    """

    method = "packing"
    default_cost_model = "packed"

    def _setup(self) -> None:
        super()._setup()
        if self.budget.cost_model != "packed":
            raise ValueError(
                "packing prices a row by the sum of its lengths: leave cost_model=None or "
                f"set 'packed', got {self.config.cost_model!r}"
            )
        if self.patches is not None and any(self.patches):
            raise ValueError(
                "packing is text-only, but the length cache has samples with visual "
                "patches; use gmt, bmt or odb for multimodal data"
            )

    def _default_collate(self) -> Callable[[list[Any]], Any]:
        return PackCollate(ignore_index=self.config.ignore_index, label_key=self.config.label_key)

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        return PackingPlan(self.budget, self.lengths, self.config.shuffle)(pool, world_size, seed)
