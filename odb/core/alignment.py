"""Pure planning of one alignment round of the Distributed Group Alignment Protocol.

Each round every rank reports a fixed-size :class:`RankStatus`; the vectors are
all-gathered, and every rank calls :func:`plan_round` on the *same* gathered list, so
all ranks derive the same :class:`RoundPlan` (target step count ``T``, end of epoch)
without another message. Each rank then turns the plan into its own steps with
:func:`local_steps`: keep ``T`` groups (in emission order), split groups when it has
too few (where the plan allows), and pad with IDLE steps when it has no samples left.
In join mode the plan also carries a :class:`Pace`, with which a rank that has read its
view but holds fewer groups than the heaviest rank has steps left spreads fewer groups
over its ``T`` steps, instead of idling at the end of the epoch.
Because every rank yields exactly ``T`` steps per round, every rank yields the same
number of steps per epoch: the DDP contract.

Pure: no torch.distributed, no multiprocessing. The protocol and its proofs are in
``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from odb.core.budget import TokenBudget
from odb.core.grouping import Group, split_to_count

STATUS_WIDTH = 8
"""Number of int64 fields in a status vector (64 bytes per rank per round)."""

PACE_FLOOR = Fraction(3, 4)
"""Pacing stops below this share of the heaviest rank's remaining steps, and never
groups under less than this share of the token budget (see :class:`Pace`)."""


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
        buffered_tokens: Real tokens of the ``buffered`` samples.
        read_tokens: Real tokens of the ``read_count`` samples.
        unread: Samples of its view not read yet; -1 when unknown (a stream that has
            not ended). Used only for pacing (:class:`Pace`).
    """

    ready: int
    buffered: int
    read_done: bool
    read_count: int
    free_slots: int
    failed: bool = False
    buffered_tokens: int = 0
    read_tokens: int = 0
    unread: int = -1

    @property
    def dry(self) -> bool:
        """Nothing buffered and nothing left to read: only IDLE steps remain."""
        return self.read_done and self.buffered == 0

    def to_row(self) -> list[int]:
        """Encode as ``STATUS_WIDTH`` ints (the wire format); both flags share one field."""
        flags = int(self.read_done) | int(self.failed) << 1
        return [
            self.ready,
            self.buffered,
            flags,
            self.read_count,
            self.free_slots,
            self.buffered_tokens,
            self.read_tokens,
            self.unread,
        ]

    @classmethod
    def from_row(cls, row: Sequence[int]) -> RankStatus:
        """Decode a row written by :meth:`to_row`."""
        if len(row) != STATUS_WIDTH:
            raise ValueError(f"status row must have {STATUS_WIDTH} fields, got {len(row)}")
        ready, buffered, flags, read_count, free_slots, b_tokens, r_tokens, unread = (
            int(v) for v in row
        )
        return cls(
            ready,
            buffered,
            bool(flags & 1),
            read_count,
            free_slots,
            bool(flags & 2),
            b_tokens,
            r_tokens,
            unread,
        )


@dataclass(frozen=True)
class Pace:
    """How a rank with less work left paces itself on the rank with the most (join mode).

    Every rank's *remaining steps* are estimated from its row: its ready groups (all of
    its groups once it cannot read more; at most one fewer while it reads) plus its
    unread tokens (unread samples at its own mean read length) over
    ``tokens_per_group``, the buffered real tokens per ready group pooled over all
    ranks. Exact rationals, so every rank computes the same numbers from the rows.

    A rank that has read its whole view knows its remaining steps exactly: its ``g``
    groups. If ``g`` falls short of the most of any active rank, ``E``, it spreads only
    ``floor(T * g / E)`` of its groups over this round's ``T`` steps (:meth:`take`),
    so it ends with the heaviest rank instead of running dry and idling. Light ranks
    finish reading first, so the deficit is spread over every round from then on and
    each step loses little fill. When ``g < PACE_FLOOR * E`` the deficit is taken as
    structural (e.g. skewed views): the rank keeps its full groups rather than make all
    of them much lighter. A rank still reading is never paced: its own estimate is not
    exact, and pacing a rank that turns out heaviest would add steps.

    Attributes:
        heaviest: The most remaining steps of any active rank (``E > 0``).
        tokens_per_group: Buffered real tokens per ready group, all ranks (``> 0``).
    """

    heaviest: Fraction
    tokens_per_group: Fraction

    def remaining(self, status: RankStatus) -> Fraction:
        """A rank's estimated remaining steps (its ready groups when nothing is unread)."""
        if status.unread <= 0:
            return Fraction(status.ready)
        mean = Fraction(status.read_tokens, max(1, status.read_count))
        return status.ready + status.unread * mean / self.tokens_per_group

    def take(self, own: RankStatus, target: int, share: Fraction = PACE_FLOOR) -> int:
        """How many of its ready groups rank ``own`` spreads over ``target`` steps.

        ``max(1, floor(target * g / E))`` when ``own`` has read its whole view and
        ``share * E <= g < E`` (``g = own.ready``); otherwise ``target`` (no pacing).
        Never more than ``target``; taking ``floor(T * g / E)`` each round keeps a paced
        rank at or below the heaviest rank's remaining steps (docs/protocol.md, G6).
        """
        g = own.ready
        if not own.read_done or not share * self.heaviest <= g < self.heaviest:
            return target
        return max(1, min(target, int(target * g / self.heaviest)))


def _pace(statuses: Sequence[RankStatus], active: Sequence[RankStatus]) -> Pace | None:
    """The round's :class:`Pace`. None while some view's size is unknown (a stream), a
    rank with unread samples has read none, or no rank holds a ready group."""
    ready = sum(s.ready for s in statuses)
    tokens = sum(s.buffered_tokens for s in statuses)
    unknown = any(s.unread < 0 or (s.unread > 0 and s.read_count == 0) for s in statuses)
    if unknown or not ready or not tokens:
        return None
    pace = Pace(Fraction(1), Fraction(tokens, ready))
    heaviest = max(pace.remaining(s) for s in active)
    return replace(pace, heaviest=heaviest) if heaviest > 0 else None


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
        pace: Join mode with known view sizes: how ranks with less work left pace
            themselves on the heaviest one this round (:class:`Pace`).
    """

    target: int
    end: bool
    split: bool = False
    read_limit: int | None = None
    failed_ranks: tuple[int, ...] = ()
    pace: Pace | None = None


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
    pace = _pace(statuses, active) if join else None
    return RoundPlan(
        target=max(1, min(target, max_steps)),
        end=False,
        split=split,
        read_limit=read_limit,
        pace=pace,
    )


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
