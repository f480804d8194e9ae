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

What the plans share lives here: the plan's shape, the dealing of groups or steps to
ranks (IDLE-padding the tail), the seeded shuffle, and the invariant check every plan
passes before its epoch runs. Each method's plan is in its own module of
:mod:`baselines.methods`, beside its loader.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import odb
import odb.kit

__all__ = [
    "Plan",
    "StepIds",
    "check_plan",
    "check_world",
    "chunks",
    "deal",
    "deal_steps",
    "permutation",
    "shuffled",
    "sized_samples",
]

StepIds = tuple[int, ...]
"""The sample indices of one rank's step; ``()`` is an IDLE step."""
Plan = list[list[StepIds]]
"""One list of steps per rank, all of the same length."""


def permutation(n: int, seed: int) -> list[int]:
    """A seeded permutation of ``range(n)`` (torch's generator: the same on every rank)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(n, generator=generator).tolist()


def shuffled(units: list, seed: int, shuffle: bool) -> list:
    """``units`` in the seeded order of :func:`permutation`; a copy as they are without
    ``shuffle``."""
    return [units[i] for i in permutation(len(units), seed)] if shuffle else list(units)


def deal(groups: Sequence[StepIds], world_size: int) -> Plan:
    """Deals groups round-robin (group ``j`` to rank ``j % W``), IDLE-padding the tail.

    Example:
        >>> deal([(0, 1), (2,), (3,)], 2)
        [[(0, 1), (3,)], [(2,), ()]]
    """
    check_world(world_size)
    steps = [tuple(groups[j : j + world_size]) for j in range(0, len(groups), world_size)]
    return deal_steps(steps, world_size)


def deal_steps(steps: Sequence[Sequence[StepIds]], world_size: int) -> Plan:
    """Turns a list of steps (``<= W`` groups each, rank order) into a plan.

    Example:
        >>> deal_steps([[(5,), (6,)], [(7,)]], 2)
        [[(5,), (7,)], [(6,), ()]]
    """
    check_world(world_size)
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


def check_world(world_size: int) -> None:
    """Refuse a world size that is not an int >= 1."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")


def chunks(order: Sequence[int], size: int) -> list[StepIds]:
    """``order`` cut into consecutive groups of ``size`` (the last may be short)."""
    return [tuple(order[k : k + size]) for k in range(0, len(order), size)]


def sized_samples(
    pool: Sequence[int], lengths: Sequence[int], patches: Sequence[int] | None
) -> list[odb.kit.SizedSample]:
    """The pool as :class:`odb.kit.SizedSample` items (key, length, patches), for grouping."""
    return [
        odb.kit.SizedSample(i, int(lengths[i]), int(patches[i]) if patches is not None else 0)
        for i in pool
    ]
