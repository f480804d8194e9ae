"""One rank's side of the round protocol, as pure state: no I/O, no collectives.

:class:`RankRounds` is what the collate side runs between its reads and its
collectives, and what the planner tests and the benchmark simulator drive directly
for many ranks in one process. Per round:

1. :meth:`RankRounds.wants_read` / :meth:`RankRounds.add` fill the window;
2. :meth:`RankRounds.status` is this rank's row of the all-gather;
3. :meth:`RankRounds.decide` takes every rank's row and returns the plan and this
   rank's steps (groups to collate, IDLE count), removing the chosen samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from odb.alignment import LocalSteps, RankStatus, RoundPlan, local_steps, plan_round
from odb.buffer import SampleBuffer
from odb.config import ODBConfig


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
    """

    def __init__(self, config: ODBConfig, view_size: int | None) -> None:
        self.config = config
        self.view_size = view_size
        self.read_count = 0
        self.buffer = SampleBuffer(
            config.budget, config.window_tokens, config.buffer_size, config.age_limit
        )
        self.read_limit: int | None = None
        self.recirculated = 0
        self.rounds = 0
        self._ready: list = []
        self._waiting: list = []

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

    def status(self, free_slots: int) -> RankStatus:
        """Group the window and describe it; call once per round after reading."""
        can_read = self._may_read() and len(self.buffer) < self.config.buffer_size
        self._ready, self._waiting = self.buffer.plan(can_read)
        return RankStatus(
            len(self._ready), len(self.buffer), self.read_done, self.read_count, free_slots
        )

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
        steps = local_steps(self._ready, self._waiting, plan.target, plan.split, cfg.budget)
        self.recirculated += sum(g.size for g in self._ready[plan.target :])
        self.rounds += 1
        return RoundOutcome(plan, steps, self.buffer.take(steps.groups))

    def leftover(self) -> list[Any]:
        """Remove and return the payloads still buffered (the non-join carry)."""
        return [payload for *_, payload in self.buffer.drain()]
