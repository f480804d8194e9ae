"""Exactly-once resume state of a loader: what an epoch still owes, independent of ranks.

The state names the epoch and the samples already *consumed* by the trainers (yielded
before the checkpoint), over all ranks. Samples that were buffered, recirculated or
sitting in a queue at checkpoint time were not consumed, so they are simply owed again:
on resume the remaining samples of the epoch (in the epoch's seeded order) are dealt
round-robin to however many ranks there are now. That gives exactly-once emission per
epoch and elastic world sizes with no per-rank state. Pure; no tensors: a bitmap over
dataset indices (125 kB per million samples) plus short index lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from odb.sharding import epoch_order

VERSION = "version"
EPOCH = "epoch"
NUM_SAMPLES = "num_samples"
SEED = "seed"
SHUFFLE = "shuffle"
CARRY_IN = "carry_in"
CONSUMED_BITMAP = "consumed_bitmap"
CONSUMED_EXTRA = "consumed_extra"
EPOCH_DONE = "epoch_done"
CARRY_NEXT = "carry_next"
STATE_KEYS = (
    VERSION,
    EPOCH,
    NUM_SAMPLES,
    SEED,
    SHUFFLE,
    CARRY_IN,
    CONSUMED_BITMAP,
    CONSUMED_EXTRA,
    EPOCH_DONE,
    CARRY_NEXT,
)
STATE_VERSION = 1


@dataclass(frozen=True)
class LoaderState:
    """Where a loader stands in an epoch, over all ranks.

    Attributes:
        epoch: The epoch in progress (or just finished, when ``epoch_done``).
        num_samples: Dataset size the state was taken with; None for a stream (whose
            indices are stream positions).
        seed: Shuffle seed; the epoch order is ``epoch_order(num_samples, seed, epoch)``.
        shuffle: Whether the epoch order is shuffled.
        carry_in: Indices carried into this epoch (non-join), emitted before the rest.
        consumed: Indices yielded to the trainers this epoch (a multiset: a carried
            index may also occur fresh).
        epoch_done: The epoch finished; ``carry_next`` is owed to the next one.
        carry_next: Indices carried out of the finished epoch (non-join).
    """

    epoch: int
    num_samples: int | None
    seed: int
    shuffle: bool
    carry_in: tuple[int, ...] = ()
    consumed: tuple[int, ...] = ()
    epoch_done: bool = False
    carry_next: tuple[int, ...] = field(default=())

    def remaining(self) -> list[int]:
        """Indices still owed this epoch, carried ones first, then in epoch order."""
        if self.num_samples is None:
            raise ValueError("a stream has no epoch order to re-deal; use skip_set()")
        owed = Counter(self.consumed)
        out = []
        for index in list(self.carry_in) + epoch_order(
            self.num_samples, self.seed, self.epoch, self.shuffle
        ):
            if owed[index]:
                owed[index] -= 1
            else:
                out.append(index)
        return out

    def skip_set(self) -> frozenset[int]:
        """Stream positions already consumed this epoch (passed over on resume)."""
        return frozenset(self.consumed)

    def view_for(self, rank: int, world_size: int) -> list[int]:
        """This rank's share of what is still owed (re-sharded for ``world_size``)."""
        return self.remaining()[rank::world_size]

    def to_dict(self) -> dict[str, Any]:
        """Compact, tensor-free form (``torch.save`` / JSON friendly)."""
        size = (
            self.num_samples if self.num_samples is not None else max(self.consumed, default=-1) + 1
        )
        bitmap = bytearray((size + 7) // 8)
        extra = []
        for index in self.consumed:
            byte, bit = divmod(index, 8)
            if bitmap[byte] >> bit & 1:
                extra.append(index)
            else:
                bitmap[byte] |= 1 << bit
        return {
            VERSION: STATE_VERSION,
            EPOCH: self.epoch,
            NUM_SAMPLES: self.num_samples,
            SEED: self.seed,
            SHUFFLE: self.shuffle,
            CARRY_IN: list(self.carry_in),
            CONSUMED_BITMAP: bytes(bitmap),
            CONSUMED_EXTRA: extra,
            EPOCH_DONE: self.epoch_done,
            CARRY_NEXT: list(self.carry_next),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        """Parse :meth:`to_dict` output; unknown or missing keys are an error."""
        if not isinstance(state, dict):
            raise TypeError(f"loader state must be a dict, got {type(state).__name__}")
        state = dict(state)
        missing = [k for k in STATE_KEYS if k not in state]
        unknown = sorted(set(state) - set(STATE_KEYS))
        if missing or unknown:
            raise ValueError(
                f"loader state has missing keys {missing} and unknown keys "
                f"{unknown}; pass the dict returned by ODBLoader.state_dict()"
            )
        if state.pop(VERSION) != STATE_VERSION:
            raise ValueError(f"loader state version must be {STATE_VERSION}")
        bitmap = state.pop(CONSUMED_BITMAP)
        consumed = [i for i in range(len(bitmap) * 8) if bitmap[i // 8] >> (i % 8) & 1]
        return cls(
            epoch=state.pop(EPOCH),
            num_samples=state.pop(NUM_SAMPLES),
            seed=state.pop(SEED),
            shuffle=state.pop(SHUFFLE),
            carry_in=tuple(state.pop(CARRY_IN)),
            consumed=tuple(consumed + list(state.pop(CONSUMED_EXTRA))),
            epoch_done=state.pop(EPOCH_DONE),
            carry_next=tuple(state.pop(CARRY_NEXT)),
        )


def merge(parts: Sequence[tuple[list[int], list[int], list[int]]]) -> tuple[list[int], ...]:
    """Join per-rank ``(carry_in, consumed, carry_next)`` lists into global ones."""
    return tuple([i for part in parts for i in part[k]] for k in range(3))
