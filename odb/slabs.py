"""Recycled shared memory for the sample tensors DataLoader workers hand to a collate process.

torch hands a worker's tensor to its parent in *fresh* shared memory: a new segment, a
copy into it, a descriptor. Each fresh page costs a fault and zeroing on its first
write, and on a VM that returns freed memory to its host (free page reporting) much
more: the host must supply the page again (measured: ``docs/benchmarks.md`` 10.3 and
10.7). An ODB window holds samples for seconds, so their pages are freed in bulk long
after they were written, which is what such a host reclaims.

So a collate process keeps *slabs*: shared-memory blocks, in its hand-off pool
(:class:`odb.handoff.BlockPool`, as foreign blocks), that its DataLoader workers write
sample storages into and write again once nobody holds them.

* Before an epoch's workers fork, the collate process deals (:meth:`SlabArena.deal`)
  each worker its own slots: free slabs (the fork gives the worker their mappings) and
  empty slots to make new slabs in.
* In a worker, :meth:`WorkerSlabs.place` copies a storage of at least
  :data:`MIN_BYTES` into the smallest free slab of its deal that holds it (at most
  :data:`MAX_WASTE` times its size), or into a new slab in one of its empty slots,
  marks the slot busy and returns a reference to pickle; a new slab travels with it
  once, as a descriptor. With neither, the storage goes torch's usual way. Before it
  makes a new slab, a worker retires its free slabs beyond its share of the free cap,
  largest first (marks them RETIRED and lets go of them); the collate process drops
  them when the new slab arrives, so free slabs never hold more than the cap for long.
* In the collate process the reference becomes a storage over the whole slab
  (:func:`rebuild_slab`; the window counts the slab's bytes), held in the pool; the
  hand-off leases it to the trainer like any pool block. When its last holder lets go,
  the slot is marked free and its worker may write the slab again.

Invariant: a worker writes only into slabs of its own deal whose slot is free, and a
slot is marked free only when no tensor over its slab lives in the collate process or
the trainer; so no live tensor ever sees its bytes rewritten. The slot states live in
one shared byte array; each state change has one writer (the worker sets BUSY on a slot
it was dealt while it reads FREE; the collate process sets FREE), and a worker's data
reaches the collate process through the DataLoader's pipe after its write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from odb.handoff import BlockPool

MIN_BYTES = 1 << 20
"""Storages smaller than this take torch's usual way (a slab saves page faults; small
storages have few)."""

MAX_WASTE = 1.5
"""A free slab takes a storage of at least 1 / MAX_WASTE of its size: a slab keeps the
pages of the largest storage it held, so this bounds memory not counted as sample data."""

SLOTS = 4096
"""Slots of a collate process's arena (slabs it can keep at once)."""

EMPTY_PER_WORKER = 256
"""Empty slots dealt to each worker per epoch, to make new slabs in."""

EMPTY, FREE, BUSY, RETIRED = 0, 1, 2, 3

_arena: SlabArena | None = None


@dataclass(frozen=True)
class WorkerShare:
    """One worker's deal: free slabs by slot, empty slots for new ones, and the most
    bytes of free slabs it keeps."""

    free: dict[int, torch.Tensor]
    empty: tuple[int, ...]
    free_cap: int


@dataclass(frozen=True)
class SlabDeal:
    """An epoch's deal: the shared slot states and each worker's share."""

    status: torch.Tensor
    shares: tuple[WorkerShare, ...]

    def for_worker(self, worker_id: int) -> WorkerSlabs:
        """The worker's slabs (in the worker). The deal lets go of them, so a slab the
        worker retires is unmapped here."""
        share = self.shares[worker_id]
        free = dict(share.free)
        self.forget()
        return WorkerSlabs(self.status.numpy(), free, list(share.empty), share.free_cap)

    def forget(self) -> None:
        """Drop the deal's references to the free slabs (in the collate process once
        the workers have forked: a slab they retire is then unmapped there too)."""
        for share in self.shares:
            share.free.clear()


class WorkerSlabs:
    """A worker's slabs, in the worker: places big storages into them."""

    def __init__(
        self,
        state: np.ndarray,
        slabs: dict[int, torch.Tensor],
        empty: list[int],
        free_cap: int,
    ) -> None:
        self._state = state
        self._slabs = slabs
        self._empty = empty
        self._free_cap = free_cap

    def place(
        self, storage: torch.UntypedStorage
    ) -> tuple[int, int, torch.UntypedStorage | None] | None:
        """Copy ``storage`` into a slab; ``(slot, nbytes, new slab or None)`` or None.

        None: too small, or no free slab fits and no empty slot is left.
        """
        nbytes = storage.nbytes()
        if nbytes < MIN_BYTES:
            return None
        slot, new = self._fitting(nbytes), None
        if slot is None:
            if not self._empty:
                return None
            self._retire_beyond(self._free_cap)
            slot = self._empty.pop()
            new = torch.UntypedStorage._new_shared(_slab_size(nbytes))
            self._slabs[slot] = torch.empty(0, dtype=torch.uint8).set_(new)
        target = self._slabs[slot].numpy()[:nbytes]
        np.copyto(target, torch.empty(0, dtype=torch.uint8).set_(storage).numpy(), casting="no")
        self._state[slot] = BUSY
        return slot, nbytes, new

    def _retire_beyond(self, cap: int) -> None:
        """Let go of free slabs, largest first, until they hold at most ``cap`` bytes."""
        free = sorted(
            (s for s in self._slabs if self._state[s] == FREE),
            key=lambda s: self._slabs[s].numel(),
            reverse=True,
        )
        total = sum(self._slabs[s].numel() for s in free)
        for slot in free:
            if total <= cap:
                return
            total -= self._slabs.pop(slot).numel()
            self._state[slot] = RETIRED

    def _fitting(self, nbytes: int) -> int | None:
        best, best_size = None, 0
        for slot, slab in self._slabs.items():
            size = slab.numel()
            if nbytes <= size <= MAX_WASTE * nbytes and self._state[slot] == FREE:
                if best is None or size < best_size:
                    best, best_size = slot, size
        return best


class SlabArena:
    """A collate process's slabs: their slots, states and pool blocks.

    Args:
        pool: The hand-off pool the slabs are foreign blocks of.
        slots: Most slabs kept at once.
    """

    def __init__(self, pool: BlockPool, slots: int = SLOTS) -> None:
        self.pool = pool
        self.status = torch.zeros(slots, dtype=torch.uint8).share_memory_()
        self._state = self.status.numpy()
        self._block_of: dict[int, int] = {}  # slot -> pool block id
        self._slot_of: dict[int, int] = {}  # pool block id -> slot
        self.reused_bytes = 0
        self.new_bytes = 0

    def deal(self, workers: int, keep_bytes: int) -> SlabDeal:
        """Share the free slabs and empty slots among ``workers`` about to fork.

        Call it while no worker of an earlier deal lives. Slot states are first made
        true again: retired slabs are dropped, a slab no tensor holds is free (a
        worker's message that never arrived left it busy), a slot without a slab is
        empty. Free slabs beyond ``keep_bytes`` in all are dropped, largest first, and
        a worker about to make a new slab retires its free ones beyond
        ``keep_bytes / (2 * workers)``.
        """
        self._reconcile()
        free = sorted(
            (s for s in self._block_of if self._state[s] == FREE), key=self._size, reverse=True
        )
        total = sum(self._size(s) for s in free)
        while free and total > keep_bytes:
            slot = free.pop(0)
            total -= self._size(slot)
            self._drop(slot)
        empty = [s for s in range(len(self._state)) if self._state[s] == EMPTY]
        per_worker = min(EMPTY_PER_WORKER, len(empty) // max(workers, 1))
        shares = tuple(
            WorkerShare(
                free={s: self.pool_block(s) for s in free[w::workers]},
                empty=tuple(empty[w * per_worker : (w + 1) * per_worker]),
                free_cap=keep_bytes // (2 * max(workers, 1)),
            )
            for w in range(workers)
        )
        self.reused_bytes = self.new_bytes = 0
        return SlabDeal(self.status, shares)

    def receive(
        self, slot: int, nbytes: int, new: torch.UntypedStorage | None
    ) -> torch.UntypedStorage:
        """The storage a worker placed in ``slot`` (adopting the slab if ``new``).

        It spans the whole slab (the sample's tensors view its first ``nbytes``), so
        the window's byte count is the memory the sample keeps, not less.
        """
        if new is not None:
            self._drop_retired()  # a worker retires slabs only before it makes one
            if slot in self._block_of:  # a stale slab no deal gave out any more
                self._drop(slot)
            block = self.pool.adopt(torch.empty(0, dtype=torch.uint8).set_(new), self._freed)
            self._block_of[slot], self._slot_of[block] = block, slot
            self.new_bytes += nbytes
        else:
            self.reused_bytes += nbytes
        return self.pool.hold_view(self._block_of[slot])

    def pool_block(self, slot: int) -> torch.Tensor:
        """The ``uint8`` tensor over the slab in ``slot``."""
        return self.pool.block(self._block_of[slot])

    def _freed(self, block: int) -> None:
        self._state[self._slot_of[block]] = FREE

    def _size(self, slot: int) -> int:
        return self.pool_block(slot).numel()

    def _drop(self, slot: int) -> None:
        block = self._block_of.pop(slot)
        del self._slot_of[block]
        self.pool.drop_foreign(block)
        self._state[slot] = EMPTY

    def _drop_retired(self) -> None:
        for slot in [s for s in self._block_of if self._state[s] == RETIRED]:
            self._drop(slot)

    def _reconcile(self) -> None:
        self._drop_retired()
        for slot in range(len(self._state)):
            block = self._block_of.get(slot)
            if block is None:
                self._state[slot] = EMPTY
            else:
                self._state[slot] = BUSY if self.pool.is_held(block) else FREE


def open_arena(pool: BlockPool | None) -> None:
    """Keep slabs in this process (a collate process) in ``pool``; None: stop."""
    global _arena
    _arena = SlabArena(pool) if pool is not None else None


def current_arena() -> SlabArena | None:
    """This process's arena, if it keeps slabs."""
    return _arena


def rebuild_slab(slot: int, nbytes: int, new: torch.UntypedStorage | None) -> torch.UntypedStorage:
    """Unpickle a slab reference (in the collate process)."""
    if _arena is None:
        raise RuntimeError(
            "a sample stored in a slab reached a process that keeps none; slabs are for "
            "the DataLoader workers of an ODB collate process"
        )
    return _arena.receive(slot, nbytes, new)


def _slab_size(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of an eighth of its power of two (<= 12.5% more)."""
    step = max(4096, 1 << max(nbytes.bit_length() - 4, 0))
    return -(-nbytes // step) * step
