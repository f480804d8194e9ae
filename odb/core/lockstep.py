"""The lockstep round driver: one round of one rank, split where the collectives go.

Every rank runs the same round, in the same order, and only the transport of the two
exchanges differs between the places that run it:

1. :meth:`LockstepRank.report` reads samples into the buffer while
   :meth:`odb.core.rounds.RankRounds.wants_read` (from a :data:`Pull`: up to the round's
   share of the buffer, its sample cap and its byte cap) and returns this rank's
   :class:`odb.core.alignment.RankStatus`;
2. the statuses are all-gathered (collective 1, the 8-field wire row);
3. :meth:`LockstepRank.decide` applies the plan every rank derives from the same
   gathered list and returns this rank's steps; a peer's failure raises
   :class:`PeerFailedError` on every rank;
4. the rank collates its steps and the per-step counts are summed over the ranks
   (collective 2, a :class:`RoundCounts` row).

The collate side's epoch driver (:func:`odb._process.collate_epoch.run_epoch`) does 2
and 4 with real collectives on the alignment group. :class:`LockstepWorld` runs ``W``
ranks in one process with the all-gather in memory, through the same wire row: the
benchmark simulator (``odb/planning/simulate.py``) and the state-machine test drive the
protocol with it. So there is one round loop, and what the simulator and the tests check
is what the ranks run.

Pure: no torch, no processes, no I/O. The protocol: ``docs/protocol.md``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from odb.core.alignment import RankStatus
from odb.core.rounds import RankRounds, RoundOutcome


class PeerFailedError(RuntimeError):
    """Another rank's collate side reported a failure; this rank stops too."""


class Reading(NamedTuple):
    """One sample read from a rank's view: its measure and what the buffer keeps of it.

    ``nbytes`` is what the payload's data takes in memory (0 for a pure-length run); the
    buffer stops reading once it holds ``buffer_bytes`` (:class:`odb.core.buffer.SampleBuffer`).
    """

    length: int
    patches: int
    payload: Any
    nbytes: int = 0


Pull = Callable[[], "Reading | None"]
"""Reads the next sample of the view; None once the view (or stream) has ended."""


class LockstepRank:
    """One rank's side of every round: fill and report, then decide.

    Args:
        rounds: The rank's round state for this epoch.
        pull: Its view's next sample (:data:`Pull`).
        rank: Its rank, for the error a peer's failure raises.

    Attributes:
        max_age: The oldest any sample in the buffer has been at a report, in rounds.
        read_ahead_count: Samples read ahead while a collective was pending
            (:meth:`read_ahead`).
        read_ahead_s: Seconds spent reading them (inside the collective's wait).
        peak_bytes: The most bytes the buffer, the samples read ahead and the batches
            the trainer holds took at once while reading ahead (the buffer's own peak
            is its buffer's).

    Example:
        >>> from odb.core.config import ODBConfig
        >>> view = iter([Reading(3, 0, "a"), Reading(4, 0, "b")])
        >>> rank = LockstepRank(RankRounds(ODBConfig(token_budget=8), None),
        ...                     lambda: next(view, None))
        >>> status = rank.report(lambda: 4)
        >>> status.read_count, status.read_done
        (2, True)
        >>> rank.decide([status]).payloads  # one step: both samples, longest first
        [['b', 'a']]
    """

    def __init__(self, rounds: RankRounds, pull: Pull, rank: int = 0) -> None:
        self.rounds = rounds
        self.pull = pull
        self.rank = rank
        self.max_age = 0
        self.read_ahead_count = 0
        self.read_ahead_s = 0.0
        self.peak_bytes = 0
        # Pulled while a collective was pending, not yet in the buffer: readings, None
        # (the view ended) or the exception the pull raised, in pull order.
        self._ahead: deque[Reading | Exception | None] = deque()
        self._ahead_bytes = 0

    def report(self, free_slots: Callable[[], int]) -> RankStatus:
        """Read until the buffer holds enough work (or the view ends); this rank's row.

        Samples read ahead (:meth:`read_ahead`) are taken first, in the order they were
        pulled, so the buffer sees the same samples in the same rounds as without the
        read-ahead. ``free_slots`` is asked after the reads: the trainer drains the
        output queue while the rank reads, and the status says what is free when it is
        sent.
        """
        rounds = self.rounds
        while rounds.wants_read():
            reading = self._next()
            if reading is None:
                rounds.mark_exhausted()
                break
            rounds.add(*reading)
        status = rounds.status(free_slots())
        self.max_age = max(self.max_age, rounds.buffer.max_age)
        return status

    def read_ahead(self) -> bool:
        """Pull one sample for a later round while a collective is pending.

        The reads a round makes (:meth:`report`) stop while the rank waits for its peers;
        its DataLoader workers then stop too once their prefetch is full. Called in that
        wait, this keeps them busy: the sample is kept aside, outside the buffer and its
        status, so the protocol is unchanged, and :meth:`report` takes it first. Held
        together with the buffer within its caps (``buffer_size`` samples,
        ``buffer_bytes`` bytes, plus one sample) and within the round's read limit. An
        exception of the pull is kept in its place and raised by the :meth:`report`
        that reaches it, where it would have been raised without the read-ahead.

        Returns:
            True if a sample was read and there is room for another.
        """
        if not self._may_read_ahead():
            return False
        started = time.perf_counter()
        try:
            reading = self.pull()
        except Exception as exc:  # noqa: BLE001 - raised where report() reaches it
            self._ahead.append(exc)
            return False
        finally:
            self.read_ahead_s += time.perf_counter() - started
        self._ahead.append(reading)
        if reading is None:
            return False
        self._ahead_bytes += reading.nbytes
        self.read_ahead_count += 1
        buffer = self.rounds.buffer
        held = buffer.nbytes + self._ahead_bytes + buffer.held_bytes()
        self.peak_bytes = max(self.peak_bytes, held)
        return self._may_read_ahead()

    def discard_read_ahead(self) -> None:
        """Drop what was read ahead: samples, and a pull's error kept for later.

        Called when an epoch ends early (an error, a stop). A kept error's traceback
        holds the frames that read it, and with them this rank: a reference cycle that
        would keep every sample read (and the iterator the frames hold) alive until the
        next garbage collection.
        """
        self._ahead.clear()
        self._ahead_bytes = 0

    def unread_ahead(self) -> list[Reading]:
        """Remove and return the samples read ahead (a stream's carry at the epoch's end).

        Raises:
            Exception: The pull failed while reading ahead.
        """
        readings = []
        while self._ahead:
            item = self._ahead.popleft()
            if isinstance(item, Exception):
                raise item
            if item is not None:
                readings.append(item)
        self._ahead_bytes = 0
        return readings

    def _next(self) -> Reading | None:
        if not self._ahead:
            return self.pull()
        item = self._ahead.popleft()
        if isinstance(item, Exception):
            raise item
        if item is not None:
            self._ahead_bytes -= item.nbytes
        return item

    def _may_read_ahead(self) -> bool:
        rounds, buffer = self.rounds, self.rounds.buffer
        pulled = rounds.read_count + len(self._ahead)
        if self._ahead and (self._ahead[-1] is None or isinstance(self._ahead[-1], Exception)):
            return False
        if rounds.view_size is not None and pulled >= rounds.view_size:
            return False
        if rounds.read_limit is not None and pulled >= rounds.read_limit:
            return False
        return (
            len(buffer) + len(self._ahead) < buffer.capacity
            and buffer.nbytes + self._ahead_bytes + buffer.held_bytes() < buffer.buffer_bytes
        )

    def decide(self, statuses: Sequence[RankStatus]) -> RoundOutcome:
        """Apply the round's plan, derived from every rank's status (in rank order).

        Raises:
            PeerFailedError: A rank reported a failure; every rank raises it.
        """
        outcome = self.rounds.decide(statuses)
        if outcome.plan.failed_ranks:
            raise PeerFailedError(
                f"ODB ranks {list(outcome.plan.failed_ranks)} failed; rank {self.rank} stops"
            )
        return outcome


class LockstepWorld:
    """``W`` ranks in one process, the status all-gather done in memory.

    The statuses travel through their wire row (:meth:`RankStatus.to_row` /
    :meth:`RankStatus.from_row`) as on real ranks, and every rank must derive the same
    plan (checked: a difference is a bug in the pure planning).

    Example:
        >>> from odb.core.config import ODBConfig
        >>> def reader(view):
        ...     it = iter(view)
        ...     return lambda: next(it, None)
        >>> cfg = ODBConfig(token_budget=8)
        >>> world = LockstepWorld([
        ...     LockstepRank(RankRounds(cfg, 1), reader([Reading(3, 0, "a")]), 0),
        ...     LockstepRank(RankRounds(cfg, 2), reader([Reading(2, 0, "b"),
        ...                                             Reading(4, 0, "c")]), 1)])
        >>> statuses, outcomes = world.round([4, 4])
        >>> outcomes[0].plan.target, [o.payloads for o in outcomes]
        (1, [[['a']], [['c', 'b']]])
    """

    def __init__(self, ranks: Sequence[LockstepRank]) -> None:
        self.ranks = list(ranks)

    def report(self, free_slots: Sequence[int]) -> list[RankStatus]:
        """Every rank's status, in rank order, each with its own free output slots."""
        return [
            rank.report(partial(int, free))
            for rank, free in zip(self.ranks, free_slots, strict=True)
        ]

    def decide(self, statuses: Sequence[RankStatus]) -> list[RoundOutcome]:
        """Every rank's outcome of the round, from the same gathered list."""
        gathered = [RankStatus.from_row(s.to_row()) for s in statuses]
        outcomes = [rank.decide(gathered) for rank in self.ranks]
        plans = {o.plan for o in outcomes}
        if len(plans) != 1:
            raise AssertionError(f"ranks derived different plans: {plans}")
        return outcomes

    def round(self, free_slots: Sequence[int]) -> tuple[list[RankStatus], list[RoundOutcome]]:
        """One whole round: report, gather, decide."""
        statuses = self.report(free_slots)
        return statuses, self.decide(statuses)


@dataclass(frozen=True)
class StepCounts:
    """One step's counts: summed over the ranks, they normalise the step's loss."""

    samples: int
    loss_tokens: int
    real_tokens: int


@dataclass(frozen=True)
class RoundCounts:
    """Collective 2's payload: per-step counts, then the epoch's reads so far.

    A rank sends its own counts and receives the sums over all ranks in the same shape
    (an all-reduce of :meth:`to_row`). ``3 T + 2`` int64 with the round's agreed ``T``.

    Attributes:
        steps: One :class:`StepCounts` per step of the round, in step order.
        read_samples: Samples read from the view this epoch, up to this round.
        read_tokens: Real tokens of those samples.

    Example:
        >>> counts = RoundCounts((StepCounts(2, 10, 12), StepCounts(0, 0, 0)), 5, 40)
        >>> counts.to_row()
        [2, 10, 12, 0, 0, 0, 5, 40]
        >>> RoundCounts.from_row(counts.to_row()) == counts
        True
    """

    steps: tuple[StepCounts, ...]
    read_samples: int
    read_tokens: int

    def to_row(self) -> list[int]:
        """Encode as ``3 T + 2`` ints: each step's three counts, then the reads."""
        row = [n for s in self.steps for n in (s.samples, s.loss_tokens, s.real_tokens)]
        return row + [self.read_samples, self.read_tokens]

    @classmethod
    def from_row(cls, row: Sequence[int]) -> RoundCounts:
        """Decode a row written by :meth:`to_row` (or the sum of such rows)."""
        if len(row) < 2 or (len(row) - 2) % 3:
            raise ValueError(f"a counts row has 3 * steps + 2 fields, got {len(row)}")
        values = [int(v) for v in row]
        steps = tuple(StepCounts(*values[i : i + 3]) for i in range(0, len(values) - 2, 3))
        return cls(steps, values[-2], values[-1])
