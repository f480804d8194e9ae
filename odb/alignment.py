"""Pure planning of one alignment round of the Distributed Group Alignment Protocol.

Each round every rank reports a fixed-size :class:`RankStatus`; the vectors are
all-gathered, and every rank calls :func:`plan_round` on the *same* gathered list, so
all ranks derive the same :class:`RoundPlan` (target step count ``T``, end of epoch)
without another message. Each rank then turns the plan into its own steps with
:func:`local_steps`: keep ``T`` groups (fullest first), split groups when it has too
few (where the plan allows), and pad with IDLE steps when it has no samples left.
Because every rank yields exactly ``T`` steps per round, every rank yields the same
number of steps per epoch: the DDP contract.

Pure: no torch.distributed, no multiprocessing. The protocol and its proofs are in
``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from odb.budget import TokenBudget
from odb.grouping import Group, split_to_count

STATUS_WIDTH = 8
"""Number of int64 fields in a status vector (64 bytes per rank per round)."""


@dataclass(frozen=True)
class RankStatus:
    """What one rank tells its peers at the start of a round.

    Attributes:
        ready: Groups this rank can emit now without waiting for more samples.
        buffered: Samples read from its view and not yet emitted.
        read_done: Its view is fully read (nothing more will arrive this epoch).
        read_count: Samples read from its view so far this epoch.
        free_slots: Free places in its output queue.
        failed: Its collate side hit an error; every rank stops and raises.
    """

    ready: int
    buffered: int
    read_done: bool
    read_count: int
    free_slots: int
    failed: bool = False

    @property
    def dry(self) -> bool:
        """Nothing buffered and nothing left to read: only IDLE steps remain."""
        return self.read_done and self.buffered == 0

    def to_row(self) -> list[int]:
        """Encode as ``STATUS_WIDTH`` ints (the wire format)."""
        row = [self.ready, self.buffered, int(self.read_done), self.read_count,
               self.free_slots, int(self.failed)]
        return row + [0] * (STATUS_WIDTH - len(row))

    @classmethod
    def from_row(cls, row: Sequence[int]) -> RankStatus:
        """Decode a row written by :meth:`to_row`."""
        if len(row) != STATUS_WIDTH:
            raise ValueError(f"status row must have {STATUS_WIDTH} fields, got {len(row)}")
        ready, buffered, read_done, read_count, free_slots, failed = (int(v) for v in row[:6])
        return cls(ready, buffered, bool(read_done), read_count, free_slots, bool(failed))


@dataclass(frozen=True)
class RoundPlan:
    """The decision every rank derives from the gathered statuses.

    Attributes:
        target: Steps every rank yields this round (0 only when ``end``).
        end: The epoch is over for every rank.
        split: Ranks with fewer ready groups than ``target`` split groups to reach it.
        read_limit: In non-join mode, the highest ``read_count`` any rank may reach
            by the next round (keeps views read in step, which bounds the carry).
        failed_ranks: Ranks that reported a failure (``end`` is then True).
    """

    target: int
    end: bool
    split: bool = False
    read_limit: int | None = None
    failed_ranks: tuple[int, ...] = ()


def plan_round(
    statuses: Sequence[RankStatus],
    *,
    policy: str,
    join: bool,
    max_steps: int,
    buffer_size: int,
) -> RoundPlan:
    """Compute the round's plan; deterministic in its arguments.

    Args:
        statuses: One status per rank, in rank order (the all-gather result).
        policy: ``"balanced"`` or ``"paper"``.
        join: Join mode (identity coverage) or non-join mode (quota closure).
        max_steps: Most steps one round may emit (the output queue depth).
        buffer_size: Per-rank buffer cap; sets the non-join read-lag allowance.

    Returns:
        The plan. Unless ``end``, ``1 <= target <= max_steps``.
    """
    failed = tuple(r for r, s in enumerate(statuses) if s.failed)
    if failed:
        return RoundPlan(target=0, end=True, failed_ranks=failed)
    active = [s for s in statuses if not s.dry]
    if not active or (not join and len(active) < len(statuses)):
        # Non-join: the first dry rank ends the epoch for everyone, so no rank idles.
        return RoundPlan(target=0, end=True)
    read_limit = None if join else min(s.read_count for s in statuses) + buffer_size
    if policy == "paper":
        target = _paper_target(active)
        split = True
    elif policy == "balanced":
        target, split = _balanced_target(active)
    else:
        raise ValueError(f"policy must be 'balanced' or 'paper', got {policy!r}")
    if not join:
        # No rank may run out of samples inside a round in non-join mode.
        target = min(target, min(s.buffered for s in active))
    return RoundPlan(target=max(1, min(target, max_steps)), end=False, split=split,
                     read_limit=read_limit)


def _paper_target(active: Sequence[RankStatus]) -> int:
    """Max-based bidirectional rule of the paper.

    ``T = min(max ready, min positive free slots, min positive buffered)``: the most
    groups any rank has, bounded by what every rank can hold and can split into.
    """
    target = max(s.ready for s in active)
    free = [s.free_slots for s in active if s.free_slots > 0]
    if free:
        target = min(target, min(free))
    buffered = [s.buffered for s in active if s.buffered > 0]
    return min(target, min(buffered)) if buffered else target


def _balanced_target(active: Sequence[RankStatus]) -> tuple[int, bool]:
    """Smallest ready count in steady state; max with splitting in the drain phase.

    While any rank still reads, the rank with the fewest ready groups sets ``T`` and
    the others keep their excess for later rounds (no splitting, so no rank's groups
    are broken up). Once every rank has read its whole view, all remaining work is
    known: ``T`` is the largest ready count and lighter ranks split, which turns what
    would be IDLE steps into small real steps.
    """
    if all(s.read_done for s in active):
        return max(s.ready for s in active), True
    return min(s.ready for s in active), False


@dataclass(frozen=True)
class LocalSteps:
    """One rank's share of a round: real groups to emit, then IDLE steps."""

    groups: tuple[Group, ...]
    idle: int

    @property
    def count(self) -> int:
        return len(self.groups) + self.idle


def local_steps(
    ready: Sequence[Group],
    waiting: Sequence[Group],
    target: int,
    split: bool,
    budget: TokenBudget,
) -> LocalSteps:
    """Turn the round's target into this rank's steps.

    Args:
        ready: Groups this rank may emit now, in emission order (fullest first).
        waiting: Groups it would rather keep for later (a tail that may still fill).
        target: ``T`` from the plan.
        split: Whether the plan lets ranks split groups to reach ``T``.
        budget: The budget groups were formed under (splitting keeps them valid).

    Returns:
        Exactly ``target`` steps. Real groups come first; IDLE steps only when the rank
        holds fewer samples than needed. Groups not returned stay buffered
        (recirculated) and are regrouped next round.
    """
    chosen = list(ready[:target])
    if len(chosen) < target:
        # Waiting groups are whole groups: take them before idling, split or not.
        pool = list(ready) + list(waiting)
        if len(pool) < target and (split or not ready):
            pool = split_to_count(pool, target, budget)
        chosen = pool[:target]
    return LocalSteps(groups=tuple(chosen), idle=target - len(chosen))
