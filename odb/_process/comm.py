"""The private alignment group: the two collectives of a round, and the failure notes.

The collate sides of all ranks talk over their own Gloo group, never the trainer's
(NCCL) group, so alignment traffic cannot interleave with gradient all-reduces. They
meet through rank 0's store (:mod:`odb._process.rendezvous`); each iteration (epoch)
builds a fresh ``ProcessGroupGloo`` under its own store prefix, so two loaders or two
epochs never share a group. Only public ``torch.distributed`` API is used.

Timeouts: meeting the peers at the start of an iteration (the store connection and
Gloo's full-mesh connect) waits at most ``init_timeout_s``; every collective after that
at most ``align_timeout_s``. A failed collective raises :class:`~odb.AlignmentTimeoutError`
saying which of three things happened: a peer left a failure note (it raised; the
note names its rank and error), the wait timed out, or a peer's connection closed
(it stopped iterating or died). A rank that fails calls :meth:`AlignmentGroup.
report_failure` and then :meth:`AlignmentGroup.close`, so its peers' collectives fail
at once rather than after ``align_timeout_s``; a collate process that died cannot, and
its trainer leaves the note for it (:func:`leave_failure_note`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Protocol, cast

import torch
import torch.distributed as dist

from odb._process.rendezvous import Rendezvous, SignedStore, StoreForgeryError, is_forgery
from odb.core.alignment import STATUS_WIDTH
from odb.core.sharding import SOURCE_ROW_WIDTH

# Store key under the group's prefix where a failing rank leaves its error for the peers.
_FAILED_KEY = "odb_failed/"
# Longest wait for the store while reading or writing those notes.
_NOTE_TIMEOUT_S = 2.0
# How long a rank whose peer's connection closed waits for that peer's note: a dead
# collate process's note is left by its trainer's watcher, a moment after the close.
_NOTE_WAIT_S = 2.0
_NOTE_POLL_S = 0.05
# While meeting, Gloo waits up to five times its group's timeout for a peer to connect
# (gloo/transport/tcp/pair.h, ``waitUntil``: "a longer timeout when waiting for initial
# connect"). The group is built with a fifth of init_timeout_s so that a peer that left
# halfway through the rendezvous ends it within init_timeout_s, not five times that.
_GLOO_CONNECT_FACTOR = 5


class _Collectives(Protocol):
    """The collectives this module calls on its ``ProcessGroupGloo``: bound on it at run
    time, missing from torch 2.13's stub of it (``torch/_C/_distributed_c10d.pyi``)."""

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]
    ) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor]) -> dist.Work: ...


def leave_failure_note(rendezvous: Rendezvous, prefix: str, summary: str) -> None:
    """Leave rank ``rendezvous.rank``'s failure note in iteration ``prefix``, from outside
    its group (best effort): the trainer's watcher, when its collate process died.

    A note the collate side left itself (its own error) is kept: it says more.
    """
    try:
        store = SignedStore(rendezvous, prefix, _NOTE_TIMEOUT_S)
        key = f"{_FAILED_KEY}{rendezvous.rank}"
        if not store.check([key]):
            store.set(key, summary[:2000])
    except Exception:  # noqa: BLE001, S110 - the store host (rank 0's trainer) may be gone
        pass


class AlignmentGroup:
    """One iteration's Gloo group among the collate sides of all ranks.

    Args:
        rendezvous: Where to meet; None for world size 1 (collectives are local).
        prefix: Store prefix unique to this loader iteration.

    Raises:
        RuntimeError: The peers did not all arrive within ``init_timeout_s``.
    """

    def __init__(self, rendezvous: Rendezvous | None, prefix: str) -> None:
        self.rendezvous = rendezvous
        self.bytes_sent = 0
        # Reads of the peers' failure notes so far (each a look at every peer's key).
        self.note_reads = 0
        self._pg: dist.ProcessGroupGloo | None = None
        self._store: SignedStore | None = None
        self._closed = False
        if rendezvous is None:
            return
        try:
            self._store = SignedStore(rendezvous, prefix, rendezvous.init_timeout_s)
            # The constructor is the rendezvous: waiting for the peers' keys is bounded by
            # the store's init_timeout_s (ranks may start an epoch far apart, e.g. after
            # rank 0 saved a checkpoint), connecting to them by Gloo's timeout times
            # _GLOO_CONNECT_FACTOR. Every collective after it: align_timeout_s.
            self._pg = dist.ProcessGroupGloo(
                self._store,
                rendezvous.rank,
                rendezvous.world_size,
                datetime.timedelta(seconds=rendezvous.init_timeout_s / _GLOO_CONNECT_FACTOR),
            )
            self._pg.set_timeout(datetime.timedelta(seconds=rendezvous.align_timeout_s))
        except RuntimeError as exc:
            if is_forgery(exc):
                raise StoreForgeryError(
                    f"ODB alignment group, rank {rendezvous.rank}: {exc}"
                ) from exc
            raise RuntimeError(
                f"ODB alignment group: rank {rendezvous.rank} could not meet its peers at "
                f"{rendezvous.host}:{rendezvous.port} within init_timeout_s="
                f"{rendezvous.init_timeout_s}: {exc}"
            ) from exc

    @property
    def world_size(self) -> int:
        return 1 if self.rendezvous is None else self.rendezvous.world_size

    def gather_status(
        self, row: list[int], while_waiting: Callable[[], bool] | None = None
    ) -> list[list[int]]:
        """All-gather one fixed-size status row; returns every rank's row in rank order.

        ``while_waiting`` is called again and again while the peers' rows have not all
        arrived, until it returns False; it must not use this group. The wait that
        follows is bounded by ``align_timeout_s`` as always.
        """
        if len(row) != STATUS_WIDTH:
            raise ValueError(f"status row must have {STATUS_WIDTH} fields, got {len(row)}")
        mine = torch.tensor(row, dtype=torch.int64)
        if self.rendezvous is None:
            return [row]
        out = [torch.zeros(STATUS_WIDTH, dtype=torch.int64) for _ in range(self.world_size)]
        work = self._open().allgather([out], [mine])
        if while_waiting is not None:
            while not work.is_completed() and while_waiting():
                pass
        self._run("status all_gather", work)
        self.bytes_sent += mine.numel() * mine.element_size()
        return [t.tolist() for t in out]

    def gather_source_rows(self, row: list[int]) -> list[list[int]]:
        """All-gather the epoch's fixed-size source row (:func:`odb.core.sharding.source_row`)."""
        if len(row) != SOURCE_ROW_WIDTH:
            raise ValueError(f"source row must have {SOURCE_ROW_WIDTH} fields, got {len(row)}")
        if self.rendezvous is None:
            return [list(row)]
        mine = torch.tensor(row, dtype=torch.int64)
        out = [torch.zeros(SOURCE_ROW_WIDTH, dtype=torch.int64) for _ in range(self.world_size)]
        self._run("source check all_gather", self._open().allgather([out], [mine]))
        self.bytes_sent += mine.numel() * mine.element_size()
        return [t.tolist() for t in out]

    def sum_counts(self, counts: list[int]) -> list[int]:
        """All-reduce (sum) a vector of per-step counts over the ranks."""
        vec = torch.tensor(counts, dtype=torch.int64)
        if self.rendezvous is None or not counts:
            return list(counts)
        self._run("count all_reduce", self._open().allreduce([vec]))
        self.bytes_sent += vec.numel() * vec.element_size()
        return vec.tolist()

    def gather_indices(self, mine: list[int]) -> list[list[int]]:
        """All-gather variable-length index lists; every rank's list, in rank order.

        Two collectives (the lengths, then the lists padded to the longest). Used once per
        epoch, at its end, not per round.
        """
        if self.rendezvous is None:
            return [list(mine)]
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        size = torch.tensor([len(mine)], dtype=torch.int64)
        self._run("carry size all_gather", self._open().allgather([sizes], [size]))
        longest = max(int(s.item()) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.int64)
        padded[: len(mine)] = torch.tensor(mine, dtype=torch.int64)
        out = [torch.zeros(longest, dtype=torch.int64) for _ in range(self.world_size)]
        if longest:
            self._run("carry all_gather", self._open().allgather([out], [padded]))
        self.bytes_sent += (1 + longest) * size.element_size()
        return [t[: int(n.item())].tolist() for t, n in zip(out, sizes, strict=True)]

    def _open(self) -> _Collectives:
        if self._pg is None:
            raise AlignmentTimeoutError("ODB alignment group used after close()")
        return cast(_Collectives, self._pg)

    def report_failure(self, summary: str) -> None:
        """Leave a note for the peers that this rank failed, and why (best effort).

        Peers whose collectives then fail read it (``_run``), so their error names
        the rank that failed first instead of only a closed connection.
        """
        if self._store is None or self.rendezvous is None:
            return
        try:
            self._store.set(f"{_FAILED_KEY}{self.rendezvous.rank}", summary[:2000])
        except Exception:  # noqa: BLE001 - the store host may be gone too
            pass

    def close(self) -> None:
        """Leave the group: its connections close at once, so peers stop waiting.

        Idempotent; collectives after this raise :class:`~odb.AlignmentTimeoutError`. Must not
        be called while another thread is inside a collective of this group.
        """
        self._closed = True
        self._pg = None  # the last reference: Gloo closes its pairs when it is freed
        self._store = None

    def _failed_peers(self) -> tuple[list[str], list[str]]:
        """Notes of peers that reported a failure (see :meth:`report_failure`), and the
        refusals of notes none of this job's ranks wrote (a stranger in the store)."""
        notes: list[str] = []
        forged: list[str] = []
        if self._store is None or self.rendezvous is None:
            return notes, forged
        self.note_reads += 1
        try:
            self._store.set_timeout(datetime.timedelta(seconds=_NOTE_TIMEOUT_S))
            for rank in range(self.rendezvous.world_size):
                key = f"{_FAILED_KEY}{rank}"
                if rank == self.rendezvous.rank or not self._store.check([key]):
                    continue
                try:
                    notes.append(f"rank {rank}: {self._store.get(key).decode(errors='replace')}")
                except StoreForgeryError as exc:
                    forged.append(str(exc))  # not a peer's note: never shown as one
        except Exception:  # noqa: BLE001 - the store host (rank 0's trainer) may be gone
            pass
        return notes, forged

    def stop_requested(self) -> bool:
        """Whether this rank was asked to stop (its trainer closed it, ``break``, exit).

        A failed collective then reads no notes: why the peers stopped is no news to a
        rank that is stopping itself. Never, here; the collate side's group says.
        """
        return False

    def _wait_for_notes(self, wait_s: float) -> tuple[list[str], list[str]]:
        """:meth:`_failed_peers`, waiting up to ``wait_s`` for a first note or refusal.

        A peer whose connection closed because its collate process died has its note
        left by its trainer a moment later; one that stopped early (``break``) leaves
        none, and this rank's error then comes ``wait_s`` later. None is read once this
        rank is asked to stop (:meth:`stop_requested`), also midway through the wait.
        """
        found: tuple[list[str], list[str]] = ([], [])
        deadline = time.monotonic() + wait_s
        while not self.stop_requested():
            found = self._failed_peers()
            if any(found) or time.monotonic() >= deadline:
                break
            time.sleep(_NOTE_POLL_S)
        return found

    def _run(self, what: str, work: dist.Work) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            # Only Gloo's own failures: an exception a signal handler raises while this
            # thread waits (the DataLoader's SIGCHLD handler) passes through unchanged.
            if not isinstance(exc, dist.DistError) and "gloo" not in str(exc).lower():
                raise
            raise AlignmentTimeoutError(self._explain(what, exc)) from exc

    def _explain(self, what: str, exc: BaseException) -> str:
        assert self.rendezvous is not None
        timeout = self.rendezvous.align_timeout_s
        head = f"ODB alignment {what} failed on rank {self.rendezvous.rank}: "
        said = f" Gloo said: {exc}"
        closed = "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower()
        notes, forged = self._wait_for_notes(_NOTE_WAIT_S if closed else 0.0)
        if notes:
            return (
                head + "a peer rank failed first (" + "; ".join(notes) + "). "
                f"This rank stops too (align_timeout_s={timeout} s bounds such waits)." + said
            )
        if forged:
            return (
                head + "a peer rank stopped, and the failure note where it would say why "
                f"is not its own: {forged[0]} This rank stops too." + said
            )
        if not closed:
            return (
                head + f"no answer from a peer rank within align_timeout_s={timeout} s. A "
                "peer is stuck or slower than that (its dataset, collate_fn or training "
                "step); raise align_timeout_s if a rank can legitimately take longer." + said
            )
        return (
            head + "a peer rank's collate side is gone: that rank raised, left the loop "
            "early (break), was interrupted or died; see its own error. All ranks must "
            f"iterate every epoch to its end (align_timeout_s={timeout} s bounds how long "
            "a rank waits for a silent peer)." + said
        )


class AlignmentTimeoutError(RuntimeError):
    """A peer of the alignment group did not answer in time, or is gone."""
