"""One rank's side of the round protocol, as pure state: no I/O, no collectives.

:class:`RankRounds` is what the round driver (:mod:`odb.core.lockstep`) runs between a
rank's reads and its collectives: on the collate side (:func:`odb._process.collate_epoch.run_epoch`)
and, for many ranks in one process, in the benchmark simulator and the state-machine
test. Per round:

1. :meth:`RankRounds.wants_read` / :meth:`RankRounds.add` fill the buffer, up to this
   round's share of the buffer (:func:`buffer_budgets_in_round`: small at the epoch's
   start, so its first step comes after a few reads, doubling every round, one step a
   round while it grows), its sample cap and its byte cap;
2. :meth:`RankRounds.status` is this rank's row of the all-gather;
3. :meth:`RankRounds.decide` takes every rank's row and returns the plan and this
   rank's steps (groups to collate, IDLE count), removing the chosen samples. A rank
   that has read its view and holds fewer groups than the heaviest rank has steps left
   spreads fewer than ``T`` of its groups over its ``T`` steps
   (:class:`odb.core.alignment.Pace`), so it ends with the heaviest rank instead of idling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from odb.core.alignment import (
    PACE_FLOOR,
    LocalSteps,
    RankStatus,
    RoundPlan,
    local_steps,
    plan_round,
)
from odb.core.budget import TokenBudget
from odb.core.buffer import SampleBuffer
from odb.core.config import ODBConfig
from odb.core.grouping import Group, split_lighter


@dataclass(frozen=True)
class RoundOutcome:
    """The plan every rank derived, and this rank's share of it."""

    plan: RoundPlan
    steps: LocalSteps
    payloads: list[list[Any]]


class RankRounds:
    """Round state of one rank over one epoch.

    Args:
        config: Loader settings (budget, buffer, cap, policy, join, queue depth).
        view_size: Samples this rank reads this epoch; None for a stream, whose end is
            known only when it is reached (:meth:`mark_exhausted`).
        held_bytes: Bytes of emitted batches the trainer has not released, counted
            against ``buffer_bytes`` (:class:`odb.core.buffer.SampleBuffer`); None: none.

    Attributes:
        paced_rounds: Rounds whose steps came from a paced regrouping of the buffer.
    """

    def __init__(
        self,
        config: ODBConfig,
        view_size: int | None,
        held_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.view_size = view_size
        self.read_count = 0
        self.read_tokens = 0
        self.buffer = SampleBuffer(
            config.budget, config.buffer_size, config.age_limit, config.buffer_bytes, held_bytes
        )
        self.read_limit: int | None = None
        self.recirculated = 0
        self.rounds = 0
        self.paced_rounds = 0
        self._can_read = False
        self._ready: list[Group] = []
        self._waiting: list[Group] = []
        self._status: RankStatus | None = None

    @classmethod
    def partway(
        cls,
        config: ODBConfig,
        view_size: int | None,
        *,
        read_count: int,
        read_tokens: int,
        read_limit: int | None,
        rounds: int,
    ) -> RankRounds:
        """A rank's round state between rounds of an epoch, its buffer still empty: how
        an exhaustive check (``bench/model_check_world.py``) starts from a state it
        reached before, without replaying the rounds that led there."""
        state = cls(config, view_size)
        state.read_count, state.read_tokens = read_count, read_tokens
        state.read_limit, state.rounds = read_limit, rounds
        return state

    @property
    def read_done(self) -> bool:
        return self.view_size is not None and self.read_count >= self.view_size

    def mark_exhausted(self) -> None:
        """The stream ended: everything this rank will read has been read."""
        self.view_size = self.read_count

    def _may_read(self) -> bool:
        return not self.read_done and (self.read_limit is None or self.read_count < self.read_limit)

    @property
    def buffer_tokens(self) -> int:
        """Tokens the buffer reads up to this round (:func:`buffer_budgets_in_round`)."""
        return buffer_budgets_in_round(self.config, self.rounds) * self.config.token_budget

    def wants_read(self) -> bool:
        """Read another sample before this round's status?"""
        return self._may_read() and self.buffer.wants_more(self.buffer_tokens)

    def add(self, length: int, patches: int, payload: Any, nbytes: int = 0) -> None:
        """Buffer one sample read from the view (its data takes ``nbytes`` bytes)."""
        self.buffer.add(length, patches, payload, nbytes=nbytes)
        self.read_count += 1
        self.read_tokens += length

    def status(self, free_slots: int) -> RankStatus:
        """Group the buffer and describe it; call once per round after reading."""
        # Full (samples or bytes): nothing more arrives before the next round, so waiting
        # for a group to fill gains nothing. Below this round's token share it would.
        self._can_read = self._may_read() and self.buffer.has_room()
        self._ready, self._waiting = self.buffer.plan(self._can_read)
        unread = -1 if self.view_size is None else self.view_size - self.read_count
        self._status = RankStatus(
            len(self._ready),
            len(self.buffer),
            self.read_done,
            self.read_count,
            free_slots,
            buffered_tokens=self.buffer.tokens,
            read_tokens=self.read_tokens,
            unread=unread,
        )
        return self._status

    def decide(self, statuses: Sequence[RankStatus]) -> RoundOutcome:
        """Apply the round's plan (derived from every rank's status) to this rank."""
        cfg = self.config
        plan = plan_round(
            statuses,
            policy=cfg.policy,
            join=cfg.join,
            max_steps=self._max_steps(statuses),
            buffer_size=cfg.buffer_size,
        )
        if plan.end:
            return RoundOutcome(plan, LocalSteps((), 0), [])
        self.read_limit = plan.read_limit
        ready, waiting = self._paced_groups(plan)
        steps = local_steps(ready, waiting, plan.target, plan.split, cfg.budget)
        self.recirculated += sum(g.size for g in ready[plan.target :])
        self.rounds += 1
        return RoundOutcome(plan, steps, self.buffer.take(steps.groups))

    def _max_steps(self, statuses: Sequence[RankStatus]) -> int:
        """The most steps of this round: one while the buffer still grows, else the cap.

        The cap is ``ODBConfig.round_step_cap`` (``max_round_steps``, default ``Q``).

        A ramp round's buffer is smaller than the full one, so its groups are coarser;
        emitting one step per round keeps that to ``log2(K / K0)`` steps an epoch while
        the buffer doubles behind them. Once every rank has read its view the ramp is
        moot (nothing more arrives), so the drain is not held back. The round index and
        the gathered statuses are the same on every rank, so is this bound.
        """
        growing = buffer_budgets_in_round(self.config, self.rounds) < self.config.buffer_budgets
        if growing and not all(s.read_done for s in statuses):
            return 1
        return self.config.round_step_cap

    def _paced_groups(self, plan: RoundPlan) -> tuple[list[Group], list[Group]]:
        """``(ready, waiting)`` to take this round's ``T`` steps from.

        The status's grouping, unless the plan paces this rank: then its first ``k < T``
        ready groups (:meth:`odb.core.alignment.Pace.take`) are split into at most ``T``
        lighter ones, under the smallest budget down to ``PACE_FLOOR`` of the token
        budget that allows it (:func:`odb.core.grouping.split_lighter`), and put first; the
        other ready groups follow unchanged, so if fewer than ``T`` pieces came out of
        the ``k``, whole groups make up the rest. Every piece is among the first ``T``,
        so all of the ``k`` groups' samples leave this round (overdue ones included).
        """
        k = plan.target
        if plan.pace is not None:
            assert self._status is not None, "a round's status() comes before its decide()"
            k = plan.pace.take(self._status, plan.target)
        if k >= plan.target:
            return self._ready, self._waiting
        full = self.config.budget
        head = split_lighter(self._ready[:k], full, plan.target, _floor_tokens(full))
        if len(head) == k:
            return self._ready, self._waiting
        self.paced_rounds += 1
        return head + self._ready[k:], self._waiting

    def leftover(self) -> list[Any]:
        """Remove and return the payloads still buffered (the non-join carry)."""
        return [payload for *_, payload in self.buffer.drain()]


def buffer_budgets_in_round(config: ODBConfig, round_index: int) -> int:
    """Budgets of tokens the buffer reads up to in round ``round_index`` of an epoch.

    ``min(buffer_budgets, initial_buffer_budgets * 2**round_index)``: the first round
    groups a small buffer, so the epoch's first steps leave after a few reads instead
    of a whole buffer's; the buffer doubles every round, so after
    ``log2(buffer_budgets / initial_buffer_budgets)`` rounds it is full size and the
    grouping is that of a full buffer. Every rank counts the same rounds, and the read target only
    decides what a rank reports, never how the gathered reports are planned.

    Example:
        >>> cfg = ODBConfig(token_budget=8, buffer_budgets=64, initial_buffer_budgets=2)
        >>> [buffer_budgets_in_round(cfg, k) for k in range(7)]
        [2, 4, 8, 16, 32, 64, 64]
    """
    doublings = min(round_index, config.buffer_budgets.bit_length())
    return min(config.buffer_budgets, config.initial_buffer_budgets << doublings)


def _floor_tokens(budget: TokenBudget) -> int:
    """The least ``max_tokens`` pacing groups under: ``PACE_FLOOR`` of the budget."""
    return max(1, math.ceil(PACE_FLOOR * budget.max_tokens))
