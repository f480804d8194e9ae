"""Process-mode hand-off of batches: reusable shared-memory blocks, leased to the trainer.

The collate process builds a batch's big fields straight into blocks of a shared-memory
pool (:func:`odb.collate.batch_empty` draws from it there) and copies the batch's other
tensor storages into one more block; the queue carries the pickled batch with each
storage as ``(block, offset, nbytes)``. The trainer maps a block once and rebuilds each
storage as a view of it, without a copy. A block stays leased to the trainer while any
tensor over it lives there; when the last one is freed its id goes back to the collate
process, which reuses the block. So a consumer may keep a batch as long as it likes
(the pool then grows), and a block's pages are touched once, not per batch, since page
faults and zeroing dominate building a big batch in fresh memory (figures:
``docs/benchmarks.md``, "Hand-off design figures").

A tensor that is neither plain nor on the CPU, and a storage already in shared memory
from elsewhere (a sample's field passed through from a DataLoader worker), travel with
torch's own reductions (a descriptor, no copy). A decoded batch owns its memory.
"""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

import numpy as np
import torch

from odb._process import torch_shm
from odb._process.pickling import reduce_plain_tensor, storage_bytes
from odb.core.buffer import sample_nbytes

# Blocks come in power-of-two sizes from BLOCK_MIN_BYTES, so a freed block fits most
# later requests of its class; a request takes the smallest free block that holds it;
# at most MAX_FREE_BLOCKS stay free (the smallest go first).
BLOCK_MIN_BYTES = 1 << 20
MAX_FREE_BLOCKS = 8
# Storages start on ALIGN-byte boundaries within a block.
ALIGN = 64


class BlockPool:
    """The collate process's shared-memory blocks, each free or held.

    A block's holders are the collate side (from :meth:`empty` until its last tensor
    there is freed) and the trainer (one lease per batch sent over it, until the
    trainer returns it). It is handed out only while free (no holder), so no tensor
    alive on either side ever sees it rewritten. A block travels to the trainer as a
    descriptor once (:meth:`first_use`) with the first batch that uses it; ids are
    never reused, so a late return of a dropped block is ignored.
    """

    def __init__(self, returns: Connection) -> None:
        self._returns = returns
        self.returned: list[int] = []  # blocks the trainer returned, for the writer
        self._blocks: dict[int, torch.Tensor] = {}
        self._holders: dict[int, int] = {}  # blocks held, by their number of holders
        self._by_address: dict[int, int] = {}  # data_ptr of a held block -> its id
        self._done: collections.deque[int] = collections.deque()  # collate side let go
        self._sent: set[int] = set()  # blocks the trainer has mapped
        self._dropped: list[int] = []  # dropped since the trainer last heard, still mapped there
        self._next_id = 0

    def empty(self, nbytes: int) -> torch.Tensor:
        """A ``uint8`` tensor over a whole free block of at least ``nbytes`` bytes."""
        self.collect()
        free = [b for b in self._blocks if b not in self._holders]
        fits = [b for b in free if nbytes <= self._blocks[b].numel()]
        if fits:
            block = min(fits, key=lambda b: self._blocks[b].numel())
        else:
            block = self._allocate(nbytes, free)
        self._hold(block)
        lease = _Lease(self._blocks[block])
        weakref.finalize(lease, self._done.append, block)
        return torch.from_numpy(np.asarray(lease))

    def lend(self, storage: torch.UntypedStorage) -> int | None:
        """The id of the held block ``storage`` is over, now leased to the trainer too."""
        block = self._by_address.get(storage.data_ptr()) if storage.nbytes() else None
        if block is not None:
            self._hold(block)
        return block

    def give_back(self, block: int) -> None:
        """End one lease of ``block`` (the trainer returned it, or it was never sent)."""
        self._let_go(block)

    def take_dropped(self) -> list[int]:
        """The blocks dropped since the last call that the trainer still maps."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def first_use(self, block: int) -> torch.Tensor | None:
        """The block's tensor if the trainer has not mapped it yet (then it has)."""
        if block in self._sent:
            return None
        self._sent.add(block)
        return self._blocks[block]

    def collect(self) -> None:
        """Let go of the blocks the trainer returned and those the collate side freed."""
        try:
            while self._returns.poll():
                block = int.from_bytes(self._returns.recv_bytes(), "little")
                self.give_back(block)
                self.returned.append(block)
        except (EOFError, OSError):  # the trainer is gone
            pass
        while self._done:
            self._let_go(self._done.popleft())

    def end_epoch(self) -> None:
        """Drop the free blocks; the trainer drops its mappings, so blocks are sent anew."""
        self.collect()
        for block in [b for b in self._blocks if b not in self._holders]:
            del self._blocks[block]
        self._sent.clear()
        self._dropped.clear()

    def _allocate(self, nbytes: int, free: list[int]) -> int:
        for block in sorted(free, key=lambda b: self._blocks[b].numel())[: -MAX_FREE_BLOCKS + 1]:
            del self._blocks[block]  # keep at most MAX_FREE_BLOCKS - 1 free ones
            if block in self._sent:
                self._sent.remove(block)
                self._dropped.append(block)
        size = max(BLOCK_MIN_BYTES, 1 << (nbytes - 1).bit_length())
        block, self._next_id = self._next_id, self._next_id + 1
        storage = torch_shm.new_shared_storage(size)  # as default_collate does in workers
        self._blocks[block] = torch.empty(0, dtype=torch.uint8).set_(storage)
        return block

    def _hold(self, block: int) -> None:
        self._holders[block] = self._holders.get(block, 0) + 1
        self._by_address[self._blocks[block].data_ptr()] = block

    def _let_go(self, block: int) -> None:
        held = self._holders.get(block)
        if held is None:
            return
        if held > 1:
            self._holders[block] = held - 1
            return
        del self._holders[block]
        self._by_address.pop(self._blocks[block].data_ptr(), None)


class PoolWriter:
    """Collate-process side: encodes batches over the pool's blocks for the queue.

    It also knows the bytes of the batches the trainer still holds (:meth:`held_bytes`):
    a batch counts from its encoding until the trainer returns one of its blocks, which
    it does when the batch's tensors over that block are freed. A batch over no block
    (every storage passed through by descriptor) is not counted: nothing would end it.
    """

    def __init__(self, returns: Connection) -> None:
        self.pool = BlockPool(returns)
        self._held: dict[int, int] = {}  # batch number -> bytes
        self._batch_of: dict[int, int] = {}  # block -> the batch it was leased with
        self._batches = 0

    def held_bytes(self) -> int:
        """Bytes of the encoded batches the trainer has not released yet."""
        self.pool.collect()
        self._release_returned()
        return sum(self._held.values())

    def _release_returned(self) -> None:
        # Before a block is leased again: its return ends the batch it was leased with.
        for block in self.pool.returned:
            self._held.pop(self._batch_of.pop(block, -1), None)
        self.pool.returned.clear()

    def encode(self, message: tuple[str, Any]) -> bytes:
        """``message`` pickled for the queue; a ``("step", batch)`` over the pool.

        It becomes ``("pooled", (new blocks, dropped blocks, rest block, pickle))``: the
        blocks the trainer has not mapped yet travel with it (:func:`_block_reference`), the ids
        of blocks the pool dropped since the last batch tell the trainer to unmap them,
        and the rest block holds the batch's small storages (None without any). Other
        messages are pickled as they are.
        """
        kind, batch = message
        if kind != "step":
            return bytes(ForkingPickler.dumps(message))
        buffer = io.BytesIO()
        pickler = _PoolPickler(buffer, self.pool)
        try:
            pickler.dump(batch)  # leases the batch's blocks to the trainer (lend)
        except BaseException:
            for block in pickler.blocks:  # nothing was sent: take the leases back
                self.pool.give_back(block)
            raise
        used = set(pickler.blocks)
        rest_block = None
        if pickler.placed:
            rest = self.pool.empty(pickler.end)
            rest_block = self.pool.lend(rest.untyped_storage())
            assert rest_block is not None
            target = rest.numpy()
            for storage, offset in pickler.placed:
                _copy(storage_bytes(storage).numpy(), target[offset : offset + storage.nbytes()])
            used.add(rest_block)
        firsts = [(b, self.pool.first_use(b)) for b in sorted(used)]
        new = [(b, _block_reference(t)) for b, t in firsts if t is not None]
        payload = (new, self.pool.take_dropped(), rest_block, buffer.getvalue())
        self._release_returned()
        if used:
            self._batches += 1
            self._held[self._batches] = sample_nbytes(batch)
            self._batch_of.update(dict.fromkeys(used, self._batches))
        return bytes(ForkingPickler.dumps(("pooled", payload)))

    def end_epoch(self) -> None:
        """After an epoch's end was sent: drop the free blocks (BlockPool.end_epoch)."""
        self.pool.end_epoch()


# The block field of a storage copied into the batch's rest block (chosen after pickling,
# once its size is known).
_REST = -1


def _block_reference(block: torch.Tensor) -> torch.Tensor | _NamedBlock:
    """A block the trainer has not mapped yet, as it travels: under ``file_system``
    sharing by name alone, else as torch shares it (a descriptor dies with its holders).

    torch's reduction takes a reference on the segment that only the trainer's unpickling
    returns: a message never read (an epoch stopped early) kept the block in ``/dev/shm``
    until the rank exited (issue 56). None is needed: a block travels leased, and the
    collate process keeps its own until the trainer, having mapped it, ends the lease.
    """
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        return block
    manager, name, size = block.untyped_storage()._share_filename_cpu_()
    return _NamedBlock(manager, name, size)


class _NamedBlock(NamedTuple):
    """A ``file_system`` block by name: the manager's socket, the segment's name, bytes."""

    manager: bytes
    name: bytes
    size: int

    def open(self) -> torch.Tensor:
        """The block mapped here, as a ``uint8`` tensor (it holds its own reference)."""
        return torch.empty(0, dtype=torch.uint8).set_(torch_shm.open_shared_storage(*self))


def _copy(source: np.ndarray, target: np.ndarray) -> None:
    """Copy bytes with a plain memcpy on this thread.

    Not torch's ``clone``, which is much slower for small slices on busy cores
    (presumably its intra-op thread pool; ``docs/benchmarks.md``, "Hand-off design
    figures").
    """
    np.copyto(target, source, casting="no")


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


class _PoolPickler(ForkingPickler):
    """Pickles a batch with its plain CPU tensors' storages as block references.

    A storage over one of the pool's held blocks is pickled as ``(block, 0, nbytes)``
    and leased to the trainer once per batch; another storage not in shared memory gets
    an aligned place in the batch's rest block (``placed``; ``end`` is the bytes needed),
    pickled as ``(_REST, offset, nbytes)``. Shared storages from elsewhere, other tensors
    and other objects pickle as with ForkingPickler.
    """

    def __init__(self, file: Any, pool: BlockPool) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._pool = pool
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}
        self._offsets: dict[int, int] = {}
        self.placed: list[tuple[torch.UntypedStorage, int]] = []
        self._lent: dict[int, int | None] = {}
        self.blocks: set[int] = set()
        self.end = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return reduce_plain_tensor(obj, self._storages) or NotImplemented
        return NotImplemented

    def persistent_id(self, obj: Any) -> tuple[Any, int, int] | None:
        if type(obj) is not torch.UntypedStorage or obj.device.type != "cpu":
            return None
        block = self._pool.lend(obj) if id(obj) not in self._lent else self._lent[id(obj)]
        if block is not None:
            self._lent[id(obj)] = block
            self.blocks.add(block)
            return block, 0, obj.nbytes()
        if obj.is_shared():
            return None  # a worker's shared memory: its descriptor travels, no copy
        offset = self._offsets.get(id(obj))
        if offset is None:
            offset = self._offsets[id(obj)] = self.end
            self.placed.append((obj, offset))  # also keeps id(obj) unique while pickling
            self.end = _aligned(offset + obj.nbytes())
        return _REST, offset, obj.nbytes()


class PoolReader:
    """Trainer side: maps blocks once, rebuilds storages as leased views, returns blocks.

    A block's lease ends when the last tensor over it is freed (in whatever thread); its
    id is queued then and sent by :meth:`flush`, which the transport calls on every
    receive, so nothing is sent from a finalizer.
    """

    def __init__(self, returns: Connection) -> None:
        self._returns = returns
        self._blocks: dict[int, torch.Tensor] = {}
        self._ended: collections.deque[int] = collections.deque()

    def decode(
        self,
        new: list[tuple[int, torch.Tensor | _NamedBlock]],
        dropped: list[int],
        rest_block: int | None,
        blob: bytes,
    ) -> Any:
        """The batch pickled in ``blob``; ``new`` are blocks that arrived with it, and
        the pool dropped ``dropped`` (leased tensors over them keep their memory)."""
        for block in dropped:
            self._blocks.pop(block, None)
        self._blocks.update((b, t.open() if isinstance(t, _NamedBlock) else t) for b, t in new)
        batch = _PoolUnpickler(io.BytesIO(blob), self._lease, rest_block).load()
        self.flush()
        return batch

    def flush(self) -> None:
        """Send the ids of the blocks whose lease ended."""
        while self._ended:
            block = self._ended.popleft()
            with contextlib.suppress(OSError):  # the collate process is gone
                self._returns.send_bytes(block.to_bytes(8, "little"))

    def end_epoch(self) -> None:
        """Drop the mappings at an epoch's end (leased tensors keep their memory)."""
        self._blocks = {}

    def close(self) -> None:
        """Drop the mappings (memory goes with the last holder) and the return pipe."""
        self._blocks = {}
        self._ended.clear()
        self._returns.close()

    def _lease(self, block: int) -> np.ndarray:
        """A byte array over ``block`` whose death ends the block's lease."""
        lease = _Lease(self._blocks[block])
        weakref.finalize(lease, self._ended.append, block)
        return np.asarray(lease)


class _Lease:
    """Exposes a block's bytes to numpy; arrays and tensors built on it keep it alive."""

    def __init__(self, block: torch.Tensor) -> None:
        self._block = block
        self.__array_interface__ = {
            "shape": (block.numel(),),
            "typestr": "|u1",
            "data": (block.data_ptr(), False),
            "version": 3,
        }


class _PoolUnpickler(pickle.Unpickler):
    """Rebuilds each block storage as a view of its leased block (views stay shared)."""

    def __init__(self, file: Any, lease: Any, rest_block: int | None) -> None:
        super().__init__(file)
        self._lease = lease
        self._rest_block = rest_block
        self._leases: dict[int, np.ndarray] = {}
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}

    def persistent_load(self, pid: tuple[int, int, int]) -> torch.UntypedStorage:
        block, offset, nbytes = pid
        if block == _REST:
            assert self._rest_block is not None, "a batch referred to a rest block it lacks"
            block = self._rest_block
        storage = self._storages.get((block, offset))
        if storage is None:
            if block not in self._leases:
                self._leases[block] = self._lease(block)
            view = self._leases[block][offset : offset + nbytes]
            storage = self._storages[(block, offset)] = torch.from_numpy(view).untyped_storage()
        return storage
