"""Exactly-once resume state of a loader: what an epoch still owes, and its per-rank pieces.

The state names the epoch and the samples already *consumed* by the trainers (yielded
before the checkpoint). Samples that were buffered, recirculated or sitting in a queue
at checkpoint time were not consumed, so they are simply owed again: on resume the
remaining samples of the epoch (in the epoch's order) are dealt round-robin to however
many ranks there are now. That gives exactly-once emission per epoch and elastic world
sizes.

Each rank knows only what *it* consumed, so a rank's ``state_dict()`` is a
:class:`StatePiece`: that rank's share of the epoch's ledger, taken without any
collective (a rank-0-only save, or a framework saving per process, cannot hang).
:func:`merge_pieces` joins the pieces of every saved rank into one :class:`LoaderState`
(the shares are disjoint, so the merge is a concatenation) and names the ranks whose
pieces are missing instead of guessing. Pure; no tensors: a bitmap over dataset
indices (125 kB per million samples) plus short index lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from odb.core.checks import check_state_keys, state_pieces
from odb.core.sharding import epoch_order

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
# A piece adds who saved it and how the loader's samples were sharded.
RANK = "rank"
WORLD_SIZE = "world_size"
SHARD = "shard"
NUM_WORKERS = "num_workers"
PIECE_KEYS = (*STATE_KEYS, RANK, WORLD_SIZE, SHARD, NUM_WORKERS)
PIECE_VERSION = 2


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

    def remaining(self, order: Sequence[int] | None = None) -> list[int]:
        """Indices still owed this epoch, carried ones first, then in epoch order.

        Args:
            order: The epoch's full order when a sampler decides it; default the seeded
                order of ``num_samples``. The owed samples are the order's multiset minus
                what was consumed, so a sampler that yields the same multiset again
                (any permutation sampler, seeded or not) resumes exactly once; one that
                draws with replacement resumes with a fresh draw of the right size.
        """
        if self.num_samples is None:
            raise ValueError("a stream has no epoch order to re-deal; use skip_set()")
        if order is None:
            order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        owed = Counter(self.consumed)
        out = []
        for index in list(self.carry_in) + list(order):
            if owed[index]:
                owed[index] -= 1
            else:
                out.append(index)
        quota = len(self.carry_in) + len(order) - len(self.consumed)
        return out[: max(quota, 0)]

    def skip_set(self) -> frozenset[int]:
        """Stream positions already consumed this epoch (passed over on resume)."""
        return frozenset(self.consumed)

    def view_for(self, rank: int, world_size: int, order: Sequence[int] | None = None) -> list[int]:
        """This rank's share of what is still owed (re-sharded for ``world_size``)."""
        return self.remaining(order)[rank::world_size]

    def share(self, rank: int, world_size: int) -> LoaderState:
        """Rank ``rank``'s part of this state, so that the parts of all ranks merge back.

        After a resume every rank holds the whole restored state; each keeps only its
        round-robin share of it in its piece, so a merge counts every index once.
        """
        return replace(
            self,
            carry_in=self.carry_in[rank::world_size],
            consumed=self.consumed[rank::world_size],
            carry_next=self.carry_next[rank::world_size],
        )

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
        check_state_keys(state, STATE_KEYS, "ODBLoader")
        if state.pop(VERSION) != STATE_VERSION:
            raise ValueError(f"loader state version must be {STATE_VERSION}")
        return cls._from_fields(state)

    @classmethod
    def _from_fields(cls, state: dict[str, Any]) -> LoaderState:
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


@dataclass(frozen=True)
class StatePiece:
    """One rank's piece of a loader's resume state (what ``state_dict()`` returns).

    Attributes:
        rank: The rank that saved it.
        world_size: Ranks of the run that saved it (how many pieces make a whole).
        shard: Who sharded the samples (``ODBConfig.shard`` as resolved): with ``"odb"``
            the indices are global and the pieces merge into one state for any world
            size; otherwise each rank's indices are its own and a rank resumes from
            its own piece at the same world size.
        num_workers: DataLoader workers of the saving run (a stream that shards
            itself over workers numbers its samples per worker).
        state: This rank's share of the epoch's ledger.

    Example:
        >>> piece = StatePiece(1, 2, "odb", 0, LoaderState(0, 10, 0, True, consumed=(3,)))
        >>> StatePiece.from_dict(piece.to_dict()) == piece
        True
    """

    rank: int
    world_size: int
    shard: str
    num_workers: int
    state: LoaderState

    def to_dict(self) -> dict[str, Any]:
        """A plain, picklable, tensor-free dict (``torch.save`` / JSON friendly)."""
        out = self.state.to_dict()
        out.update(
            {
                VERSION: PIECE_VERSION,
                RANK: self.rank,
                WORLD_SIZE: self.world_size,
                SHARD: self.shard,
                NUM_WORKERS: self.num_workers,
            }
        )
        return out

    @classmethod
    def from_dict(cls, piece: Any) -> StatePiece:
        """Parse :meth:`to_dict` output, or a complete version-1 state (one world-size-1 piece)."""
        if not isinstance(piece, dict):
            raise TypeError(
                f"a loader state piece must be a dict, got {type(piece).__name__}; pass "
                "what state_dict() returned (one dict per rank)"
            )
        if piece.get(VERSION) == STATE_VERSION:  # a whole state from before pieces
            return cls(0, 1, "odb", 0, LoaderState.from_dict(piece))
        piece = dict(piece)
        check_state_keys(piece, PIECE_KEYS, "ODBLoader")
        if piece.pop(VERSION) != PIECE_VERSION:
            raise ValueError(f"loader state piece version must be {PIECE_VERSION}")
        head = (piece.pop(RANK), piece.pop(WORLD_SIZE), piece.pop(SHARD), piece.pop(NUM_WORKERS))
        return cls(*head, LoaderState._from_fields(piece))


def parse_pieces(pieces: Any) -> list[StatePiece]:
    """The pieces passed to ``load_state_dict``: one dict, or a list of them (any order)."""
    return [StatePiece.from_dict(dict(piece)) for piece in state_pieces(pieces)]


def check_pieces(pieces: Sequence[StatePiece], need: Sequence[int] | None = None) -> None:
    """Raise unless ``pieces`` come from one save of one run and hold the ranks ``need``.

    Args:
        pieces: Parsed pieces.
        need: Ranks that must be present; default every rank of the saving run.
    """
    first = pieces[0]
    head = (first.world_size, first.shard, first.num_workers)
    for piece in pieces[1:]:
        if (piece.world_size, piece.shard, piece.num_workers) != head:
            raise ValueError(
                "loader state pieces come from different runs: rank "
                f"{first.rank} has (world_size, shard, num_workers)={head}, rank "
                f"{piece.rank} has {(piece.world_size, piece.shard, piece.num_workers)}; "
                "pass the pieces of one checkpoint"
            )
        if first.shard == "odb" and piece.state.num_samples != first.state.num_samples:
            raise ValueError(
                f"loader state pieces disagree on the dataset size: rank {first.rank} saved "
                f"{first.state.num_samples} samples, rank {piece.rank} "
                f"{piece.state.num_samples}; pass the pieces of one checkpoint"
            )
        if _position(piece.state) != _position(first.state):
            raise ValueError(
                "loader state pieces were saved at different points: rank "
                f"{first.rank} at {_describe(first.state)}, rank {piece.rank} at "
                f"{_describe(piece.state)}; save every rank's piece at the same step"
            )
    ranks = [piece.rank for piece in pieces]
    doubles = sorted({r for r in ranks if ranks.count(r) > 1})
    if doubles:
        raise ValueError(f"loader state has more than one piece of ranks {doubles}")
    outside = sorted(r for r in ranks if not 0 <= r < first.world_size)
    if outside:
        raise ValueError(
            f"loader state pieces of ranks {outside} do not fit world_size="
            f"{first.world_size}; pass the pieces of one checkpoint"
        )
    wanted = range(first.world_size) if need is None else need
    missing = [r for r in wanted if r not in ranks]
    if missing:
        raise ValueError(
            f"loader state is missing the pieces of ranks {missing} (have {sorted(ranks)} of "
            f"a {first.world_size}-rank save). Every rank's state_dict() is one piece: save "
            "each rank's piece (or gather them) and pass them all to load_state_dict"
        )


def merge_pieces(pieces: Sequence[StatePiece]) -> LoaderState:
    """Join the pieces of every rank of one save into the epoch's whole state."""
    check_pieces(pieces)
    ordered = sorted(pieces, key=lambda p: p.rank)
    return replace(
        ordered[0].state,
        carry_in=tuple(i for p in ordered for i in p.state.carry_in),
        consumed=tuple(i for p in ordered for i in p.state.consumed),
        carry_next=tuple(i for p in ordered for i in p.state.carry_next),
    )


def _position(state: LoaderState) -> tuple[Any, ...]:
    return (state.epoch, state.epoch_done, state.seed, state.shuffle)


def _describe(state: LoaderState) -> str:
    return (
        f"epoch {state.epoch} ({'finished' if state.epoch_done else 'in progress'}, "
        f"seed={state.seed}, shuffle={state.shuffle})"
    )
