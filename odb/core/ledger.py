"""One rank's exactly-once ledger: what its loader owes, read and yielded, epoch by epoch.

The loader only drives it: :meth:`Ledger.load` when a checkpoint is restored,
:meth:`Ledger.set_epoch`, :meth:`Ledger.begin_map` / :meth:`Ledger.begin_stream` when an
epoch starts, :meth:`Ledger.record` for every batch the training loop receives and
:meth:`Ledger.finish` when the epoch ends. :meth:`Ledger.piece` is this rank's resume
state (:class:`odb.core.resume.StatePiece`), a function of the ledger alone.

Invariant (exactly once): at any call of :meth:`piece`, the pieces of every rank merge
into a :class:`~odb.core.resume.LoaderState` whose ``remaining()`` is the epoch's multiset
(carry first) minus what the training loops received; so an index yielded before a save
is never yielded again in that epoch after the load, and every other one is. A
checkpoint restored into another world size is re-dealt over the new ranks; each rank's
piece then holds its round-robin share of the restored part, so a merge counts every
index once. Pure: no processes, queues or tensors (tested in ``tests/odb/core/test_ledger.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from odb.core.resume import LoaderState, StatePiece, check_pieces, merge_pieces


class Ledger:
    """The exactly-once ledger of one rank's loader (see the module docstring).

    Args:
        rank: This rank.
        world_size: Ranks of the run.
        shard: ``ODBConfig.shard`` as resolved: with ``"odb"`` indices are global and a
            restored state is dealt over the ranks; otherwise each rank's are its own.
        num_workers: DataLoader workers (a self-sharding stream numbers items per worker).
        num_samples: Dataset size; None for a stream.
        seed: The loader's shuffle seed.
        shuffle: Whether the loader shuffles.

    Example:
        >>> ledger = Ledger(0, 1, "odb", 0, 4, seed=0, shuffle=False)
        >>> ledger.begin_map([0, 1, 2, 3])
        [0, 1, 2, 3]
        >>> ledger.record([2, 0])
        >>> resumed = Ledger(0, 1, "odb", 0, 4, seed=0, shuffle=False)
        >>> resumed.load([ledger.piece()])
        >>> resumed.begin_map([0, 1, 2, 3])
        [1, 3]
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        shard: str,
        num_workers: int,
        num_samples: int | None,
        *,
        seed: int,
        shuffle: bool,
    ) -> None:
        self.rank, self.world_size, self.shard = rank, world_size, shard
        self.num_workers, self.num_samples = num_workers, num_samples
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0  # the epoch the next begin_* starts (or continues)
        self._pending: LoaderState | None = None  # restored, not begun yet (whole state)
        self._restored: LoaderState | None = None  # the restored state being continued
        self._running: int | None = None  # the epoch last begun; None since build or load
        self._base = self._empty(0)  # this rank's part of the restored state
        self._carry: list[int] = []  # owed to the next epoch (non-join), by index
        self._carry_samples: list[tuple[int, Any]] = []  # a stream's non-join carry
        self._carry_in: list[int] = []  # what the running epoch read as carry
        self._consumed: list[int] = []  # what the training loop received this epoch
        self._done = False

    @property
    def restored_consumed(self) -> int:
        """Samples (all ranks) of the running epoch consumed before the restore it continues."""
        return len(self._restored.consumed) if self._restored is not None else 0

    @property
    def carried(self) -> int:
        """Indices owed to the next epoch (non-join)."""
        return len(self._carry)

    def set_epoch(self, epoch: int) -> None:
        """Select the next epoch; a restored epoch that is skipped is dropped."""
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None  # the restored epoch is skipped: start the new one fresh
        self.epoch = epoch

    def begin_map(self, order: Sequence[int]) -> list[int]:
        """Start (or continue) the epoch over a map-style dataset; this rank's view.

        Args:
            order: The epoch's full order of indices (a sampler's or the seeded one).

        Returns:
            This rank's indices, carried ones first: what a restored epoch still owes
            (re-dealt over the ranks when the indices are global), or the carry plus
            this rank's part of ``order``.
        """
        self._begin()
        dealt = self.shard == "odb"
        if self._restored is not None:
            owed = self._restored.remaining(order)
            view, self._carry_in = owed[self.rank :: self.world_size] if dealt else owed, []
        else:
            fresh = list(order[self.rank :: self.world_size]) if dealt else list(order)
            view, self._carry_in = self._carry + fresh, self._carry
        self._carry, self._carry_samples = [], []
        return view

    def begin_stream(self) -> tuple[frozenset[int], list[tuple[int, Any]]]:
        """Start (or continue) the epoch over a stream.

        Returns:
            The stream positions to pass over (consumed before the restore) and the
            samples carried from the last epoch (non-join), emitted first.
        """
        self._begin()
        skip = self._restored.skip_set() if self._restored is not None else frozenset()
        carried = self._carry_samples
        self._carry_in = [index for index, _ in carried]
        self._carry, self._carry_samples = [], []
        return skip, carried

    def _begin(self) -> None:
        self._restored, self._pending = self._pending, None
        self._running = self.epoch
        self._base = self._empty(self.epoch) if self._restored is None else self._mine()
        self._consumed, self._done = [], False

    def record(self, sample_ids: Sequence[int]) -> None:
        """The training loop received a batch holding these indices."""
        self._consumed.extend(sample_ids)

    def finish(self, carry: Sequence[int], carried_samples: Sequence[tuple[int, Any]]) -> None:
        """The epoch ended; ``carry`` (and a stream's ``carried_samples``) go to the next."""
        self._carry = list(carry)
        self._carry_samples = list(carried_samples)
        self._done = True

    def piece(self) -> StatePiece:
        """This rank's piece of the resume state, at this point."""
        head = (self.rank, self.world_size, self.shard, self.num_workers)
        return StatePiece(*head, self._share())

    def _share(self) -> LoaderState:
        if self._pending is not None:  # restored, not begun yet
            return self._my_part(self._pending)
        if self._running is None:  # a fresh epoch not begun yet, with its carry
            return self._empty(self.epoch, carry_in=tuple(self._carry))
        return LoaderState(
            self._running,
            self.num_samples,
            self.seed,
            self.shuffle,
            self._base.carry_in + tuple(self._carry_in),
            self._base.consumed + tuple(self._consumed),
            self._done,
            tuple(self._carry) if self._done else (),
        )

    def load(self, pieces: list[StatePiece]) -> None:
        """Restore from the pieces of every saved rank (checked against this ledger).

        Raises:
            ValueError: Pieces are missing or disagree, or the dataset size, seed, shuffle,
                shard or worker count does not match this loader's.
        """
        state = self._merge(pieces)
        self._check(state)
        self._running = None
        if state.epoch_done:
            self.epoch, self._pending = state.epoch + 1, None
            self._carry = list(self._my_part(state).carry_next)
        else:
            self.epoch, self._pending, self._carry = state.epoch, state, []

    def _merge(self, pieces: list[StatePiece]) -> LoaderState:
        """The state this rank resumes from: all pieces merged, or its own (per-rank data)."""
        saved = pieces[0]
        if saved.shard != self.shard:
            raise ValueError(
                f"loader state was saved with shard={saved.shard!r} but this loader "
                f"resolved shard={self.shard!r}; build it with the saved shard setting"
            )
        if self.shard in ("worker", "rank_worker") and saved.num_workers != self.num_workers:
            raise ValueError(
                f"this stream numbers its items per DataLoader worker and the state was saved "
                f"with num_workers={saved.num_workers}; resume with num_workers="
                f"{saved.num_workers} (this loader has {self.num_workers})"
            )
        if self.shard == "odb":
            return merge_pieces(pieces)
        if saved.world_size != self.world_size:
            raise ValueError(
                f"loader state comes from a {saved.world_size}-rank run with per-rank data "
                f"(shard={self.shard!r}); each rank's samples are its own, so it resumes "
                f"only at world size {saved.world_size}, not {self.world_size}"
            )
        check_pieces(pieces, need=[self.rank])
        return next(piece.state for piece in pieces if piece.rank == self.rank)

    def _check(self, state: LoaderState) -> None:
        if self.num_samples is None:
            _check_stream_state(state)
        elif state.num_samples != self.num_samples:
            raise ValueError(
                f"loader state was saved for {state.num_samples} samples but the "
                f"dataset has {self.num_samples}; resume with the same dataset"
            )
        if (state.seed, state.shuffle) != (self.seed, self.shuffle):
            raise ValueError(
                f"loader state has seed={state.seed}, shuffle={state.shuffle} but "
                f"this loader has seed={self.seed}, shuffle="
                f"{self.shuffle}; build the loader with the saved settings"
            )

    def _mine(self) -> LoaderState:
        assert self._restored is not None
        return self._my_part(self._restored)

    def _my_part(self, state: LoaderState) -> LoaderState:
        """This rank's part of a restored state: a share of a global one, or its own."""
        return state.share(self.rank, self.world_size) if self.shard == "odb" else state

    def _empty(self, epoch: int, carry_in: tuple[int, ...] = ()) -> LoaderState:
        return LoaderState(epoch, self.num_samples, self.seed, self.shuffle, carry_in)


def _check_stream_state(state: LoaderState) -> None:
    if state.num_samples is not None:
        raise ValueError(
            "loader state was saved for a map-style dataset of "
            f"{state.num_samples} samples, but this loader reads a stream"
        )
    if state.carry_in or state.carry_next:
        raise ValueError(
            "a non-join stream checkpoint holds carried samples, which a "
            "stream cannot re-read by position; checkpoint streams in join "
            "mode, or at an epoch boundary with nothing carried"
        )
