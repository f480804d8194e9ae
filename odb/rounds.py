"""One rank's side of the round protocol, as pure state: no I/O, no collectives.

:class:`RankRounds` is what the round driver (:mod:`odb.lockstep`) runs between a
rank's reads and its collectives: on the collate side (:func:`odb.engine.run_epoch`)
and, for many ranks in one process, in the benchmark simulator and the state-machine
test. Per round:

1. :meth:`RankRounds.wants_read` / :meth:`RankRounds.add` fill the window;
2. :meth:`RankRounds.status` is this rank's row of the all-gather;
3. :meth:`RankRounds.decide` takes every rank's row and returns the plan and this
   rank's steps (groups to collate, IDLE count), removing the chosen samples. A rank
   that has read its view and holds fewer groups than the heaviest rank has steps left
   spreads fewer than ``T`` of its groups over its ``T`` steps
   (:class:`odb.alignment.Pace`), so it ends with the heaviest rank instead of idling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from odb.alignment import PACE_FLOOR, LocalSteps, RankStatus, RoundPlan, local_steps, plan_round
from odb.budget import TokenBudget
from odb.buffer import SampleBuffer
from odb.config import ODBConfig
from odb.grouping import Group, split_lighter


@dataclass(frozen=True)
class RoundOutcome:
    """The plan every rank derived, and this rank's share of it."""

    plan: RoundPlan
    steps: LocalSteps
    payloads: list[list[Any]]


class RankRounds:
    """Round state of one rank over one epoch.

    Args:
        config: Loader settings (budget, window, cap, policy, join, queue depth).
        view_size: Samples this rank reads this epoch; None for a stream, whose end is
            known only when it is reached (:meth:`mark_exhausted`).

    Attributes:
        paced_rounds: Rounds whose steps came from a paced regrouping of the window.
    """

    def __init__(self, config: ODBConfig, view_size: int | None) -> None:
        self.config = config
        self.view_size = view_size
        self.read_count = 0
        self.read_tokens = 0
        self.buffer = SampleBuffer(
            config.budget, config.window_tokens, config.buffer_size, config.age_limit
        )
        self.read_limit: int | None = None
        self.recirculated = 0
        self.rounds = 0
        self.paced_rounds = 0
        self._can_read = False
        self._ready: list = []
        self._waiting: list = []
        self._status: RankStatus | None = None

    @property
    def read_done(self) -> bool:
        return self.view_size is not None and self.read_count >= self.view_size

    def mark_exhausted(self) -> None:
        """The stream ended: everything this rank will read has been read."""
        self.view_size = self.read_count

    def _may_read(self) -> bool:
        return not self.read_done and (self.read_limit is None or self.read_count < self.read_limit)

    def wants_read(self) -> bool:
        """Read another sample before this round's status?"""
        return self._may_read() and self.buffer.wants_more()

    def add(self, length: int, patches: int, payload: Any) -> None:
        """Buffer one sample read from the view."""
        self.buffer.add(length, patches, payload)
        self.read_count += 1
        self.read_tokens += length

    def status(self, free_slots: int) -> RankStatus:
        """Group the window and describe it; call once per round after reading."""
        self._can_read = self._may_read() and len(self.buffer) < self.config.buffer_size
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
            max_steps=cfg.queue_depth,
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

    def _paced_groups(self, plan: RoundPlan) -> tuple[list[Group], list[Group]]:
        """``(ready, waiting)`` to take this round's ``T`` steps from.

        The status's grouping, unless the plan paces this rank: then its first ``k < T``
        ready groups (:meth:`odb.alignment.Pace.take`) are split into at most ``T``
        lighter ones, under the smallest budget down to ``PACE_FLOOR`` of the token
        budget that allows it (:func:`odb.grouping.split_lighter`), and put first; the
        other ready groups follow unchanged, so if fewer than ``T`` pieces came out of
        the ``k``, whole groups make up the rest. Every piece is among the first ``T``,
        so all of the ``k`` groups' samples leave this round (overdue ones included).
        """
        k = plan.target if plan.pace is None else plan.pace.take(self._status, plan.target)
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


def _floor_tokens(budget: TokenBudget) -> int:
    """The least ``max_tokens`` pacing groups under: ``PACE_FLOOR`` of the budget."""
    return max(1, math.ceil(PACE_FLOOR * budget.max_tokens))
