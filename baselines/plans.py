"""Per-epoch plans of the baselines: which samples every rank takes at every step.

A baseline decides its whole epoch before reading a sample, from the epoch's *pool*
(the dataset indices it still owes, in the seeded epoch order) and, for all but
Standard, per-sample lengths known in advance (a length cache or a proxy). A plan is
one list of steps per rank; a step is a tuple of dataset indices, and the empty tuple
is an IDLE step. Every rank computes the same plan, so each rank knows every rank's
step count without talking to it.

Equal step counts are guaranteed by construction: when the steps do not divide evenly
over the ranks, the ranks that are one short get an IDLE step at the end (a one-sample
batch with every label masked: zero gradient, but the collectives still fire). No
sample is dropped or duplicated: every pool index is in exactly one step.

The methods (every shuffle is seeded with ``seed``, which the loader sets to
``seed + epoch``):

* :class:`StandardPlan`: the pool dealt round-robin (so rank ``r`` reads
  ``pool[r::W]``, exactly ``odb.core.sharding.rank_view`` on a fresh epoch), cut into fixed
  batches in that order; the last batch of a rank may be short.
* :class:`SortedPlan`: the pool sorted by length (longest first; ties keep the pool's
  shuffled order), cut into fixed batches; each run of ``W`` adjacent batches is one
  step, so the ranks of a step hold batches of similar length; the steps are shuffled.
* :class:`GMTPlan`: greedy token-budget groups over the sorted pool
  (:func:`odb.kit.form_groups`, the same cost seam as ODB), shuffled, dealt
  round-robin.
* :class:`BMTPlan`: the same groups, sorted by cost; each run of ``W`` adjacent groups
  is one step (similar cost on every rank of a step), dealt in snake order (so no rank
  always gets the heaviest of its step), then the steps are shuffled.
* :class:`PackingPlan`: rows for a packed (concatenated) batch, filled greedily: each
  row starts with the longest remaining sample and repeatedly takes the longest one
  that still fits (the greedy knapsack of LLaMA-Factory's packing), shuffled, dealt
  round-robin.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import odb
import odb.kit

__all__ = [
    "BMTPlan",
    "GMTPlan",
    "PackingPlan",
    "Plan",
    "SortedPlan",
    "StandardPlan",
    "check_plan",
    "deal",
    "deal_steps",
]

StepIds = tuple[int, ...]
"""The sample indices of one rank's step; ``()`` is an IDLE step."""
Plan = list[list[StepIds]]
"""One list of steps per rank, all of the same length."""


def _permutation(n: int, seed: int) -> list[int]:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(n, generator=generator).tolist()


def _shuffled(units: list, seed: int, shuffle: bool) -> list:
    return [units[i] for i in _permutation(len(units), seed)] if shuffle else list(units)


def deal(groups: Sequence[StepIds], world_size: int) -> Plan:
    """Deals groups round-robin (group ``j`` to rank ``j % W``), IDLE-padding the tail.

    Example:
        >>> deal([(0, 1), (2,), (3,)], 2)
        [[(0, 1), (3,)], [(2,), ()]]
    """
    _check_world(world_size)
    steps = [tuple(groups[j : j + world_size]) for j in range(0, len(groups), world_size)]
    return deal_steps(steps, world_size)


def deal_steps(steps: Sequence[Sequence[StepIds]], world_size: int) -> Plan:
    """Turns a list of steps (``<= W`` groups each, rank order) into a plan.

    Example:
        >>> deal_steps([[(5,), (6,)], [(7,)]], 2)
        [[(5,), (7,)], [(6,), ()]]
    """
    _check_world(world_size)
    plan: Plan = [[] for _ in range(world_size)]
    for step in steps:
        if len(step) > world_size:
            raise ValueError(f"a step has {len(step)} groups for {world_size} ranks")
        for rank in range(world_size):
            plan[rank].append(tuple(step[rank]) if rank < len(step) else ())
    return plan


def check_plan(plan: Plan, pool: Sequence[int]) -> None:
    """Refuse a plan that breaks the two invariants every plan keeps.

    Checked on every plan a loader runs (also under ``python -O``), so a planner bug
    is an error before the epoch starts, never a silently dropped or repeated sample.

    Raises:
        RuntimeError: The ranks have different step counts, or the plan does not cover
            ``pool`` exactly once.
    """
    counts = {len(steps) for steps in plan}
    if len(counts) > 1:
        raise RuntimeError(f"plan bug: ranks have different step counts {sorted(counts)}")
    emitted = sorted(i for steps in plan for step in steps for i in step)
    if emitted != sorted(pool):
        raise RuntimeError(
            f"plan bug: the plan emits {len(emitted)} indices for a pool of {len(pool)}, "
            "not each exactly once"
        )


def _check_world(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")


def _chunks(order: Sequence[int], size: int) -> list[StepIds]:
    return [tuple(order[k : k + size]) for k in range(0, len(order), size)]


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
        _check_world(world_size)
        views = [list(pool[r::world_size]) for r in range(world_size)]
        per_rank = [_chunks(view, self.batch_size) for view in views]
        steps = max(len(batches) for batches in per_rank)
        return [batches + [()] * (steps - len(batches)) for batches in per_rank]


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
        _check_world(world_size)
        order = sorted(pool, key=lambda i: -self.lengths[i])  # stable: ties keep pool order
        batches = _chunks(order, self.batch_size)
        steps = [batches[j : j + world_size] for j in range(0, len(batches), world_size)]
        return deal_steps(_shuffled(steps, seed, self.shuffle), world_size)


def _items(pool: Sequence[int], lengths: Sequence[int], patches: Sequence[int] | None) -> list:
    return [
        odb.kit.SizedSample(i, int(lengths[i]), int(patches[i]) if patches is not None else 0)
        for i in pool
    ]


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
            for g in odb.kit.form_groups(_items(pool, self.lengths, self.patches), self.budget)
        ]

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return deal(_shuffled(self.groups(pool), seed, self.shuffle), world_size)


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
        _check_world(world_size)
        groups = odb.kit.form_groups(_items(pool, self.lengths, self.patches), self.budget)
        groups.sort(key=lambda g: (-self.budget.cost(g.measure), min(g.keys)))
        steps = []
        for j, start in enumerate(range(0, len(groups), world_size)):
            step = [g.keys for g in groups[start : start + world_size]]
            # Snake order: the heaviest group of a step goes to rank 0 on even steps and
            # to the last rank on odd ones, so per-rank totals stay balanced too.
            if j % 2:
                step = [()] * (world_size - len(step)) + step[::-1]
            steps.append(step)
        return deal_steps(_shuffled(steps, seed, self.shuffle), world_size)


@dataclass(frozen=True)
class PackingPlan:
    """Greedy-knapsack rows of up to ``budget`` packed tokens, shuffled, dealt round-robin.

    The budget must use the ``"packed"`` cost model. ``budget.admits`` has the last word
    on every placement, so an oversize sample still gets a row of its own.

    Example:
        >>> PackingPlan(odb.TokenBudget(8, "packed"), lengths=(5, 3, 6, 2, 1), shuffle=False)(
        ...     range(5), world_size=2, seed=0)
        [[(2, 3), (4,)], [(0, 1), ()]]
    """

    budget: odb.TokenBudget
    lengths: Sequence[int] = field(repr=False)
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.budget.cost_model != "packed":
            raise ValueError(
                f"PackingPlan needs a 'packed' cost model, got {self.budget.cost_model!r}: "
                "a packed row costs the sum of its lengths"
            )

    def rows(self, pool: Sequence[int]) -> list[StepIds]:
        """The rows, in the order they were filled (longest first sample first)."""
        # Ascending (length, index): bisect finds the longest sample within a capacity.
        remaining = sorted((int(self.lengths[i]), i) for i in pool)
        rows = []
        while remaining:
            length, index = remaining.pop()
            row, m = [index], odb.kit.GroupMeasure().plus(length)
            while remaining:
                room = self.budget.max_tokens - m.sum_len
                pos = bisect.bisect_right(remaining, (room, float("inf"))) - 1
                if pos < 0 or not self.budget.admits(m, remaining[pos][0]):
                    break
                length, index = remaining.pop(pos)
                row.append(index)
                m = m.plus(length)
            rows.append(tuple(row))
        return rows

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return deal(_shuffled(self.rows(pool), seed, self.shuffle), world_size)
