"""Process-mode hand-off of batches from the collate process to the trainer.

The collate process copies a batch's tensor storages into a shared-memory *slab* it
reuses (one per slot, ``queue_depth + 2`` slots, each slab sent to the trainer once per
epoch; both sides drop them at the epoch's end);
the queue carries the pickled batch with the storages' offsets, the trainer copies them
out and returns the slot on a pipe. A small batch thus costs two memory copies and two
small pipe messages, instead of one new shared-memory segment and one descriptor
handshake per tensor (``docs/benchmarks.md`` section 6). A storage already in shared
memory (a big field the collate function built with :func:`odb.collate.batch_cat`, or a
sample's tensor passed through from a worker) is not copied: its descriptor is handed
over, as the DataLoader's worker path does. Non-tensor fields travel by pickle; a batch
whose other storages exceed :data:`SLAB_MAX_BYTES` is pickled with torch's shared-memory
reductions instead. A decoded batch owns its memory, so a consumer may keep it.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from odb.sources import reduce_plain_tensor, storage_bytes

# Slabs: a batch whose tensor storages take more than SLAB_MAX_BYTES bypasses them; a
# slab is allocated with room to grow (x1.25, at least SLAB_MIN_BYTES); storages start
# on SLAB_ALIGN-byte boundaries.
SLAB_MAX_BYTES = 16 << 20
SLAB_MIN_BYTES = 1 << 20
SLAB_ALIGN = 64
# How often a writer waiting for a free slot re-checks the stop flag.
_RETURN_POLL_S = 0.1


class SlabWriter:
    """Collate-process side of the hand-off: batches' tensors go into reusable slabs.

    Invariants: ``slots`` is ``queue_depth + 2`` (at most ``queue_depth`` batches wait in
    the queue, one is being copied out by the trainer, one is being written), so a slot
    is free whenever the queue has room. A slot is written only while free; it is free
    from the start and again once the trainer sends its index back on ``returns`` (after
    it copied the batch out), so a batch is never overwritten while the trainer reads
    it. A slot's slab is allocated at its first use and replaced by a bigger one when a
    batch does not fit; a new slab travels (once) with the batch that first uses it. The
    lowest free slot is taken, so a trainer that keeps up leaves most slots unallocated.
    """

    def __init__(self, returns: Connection, slots: int) -> None:
        self._returns = returns
        self._slabs: list[torch.Tensor | None] = [None] * slots
        self._free = set(range(slots))

    def encode(self, message: tuple[str, Any], stop: Any) -> bytes | None:
        """``message`` pickled for the queue; None when the trainer stopped listening.

        A ``("step", batch)`` becomes ``("slab", (slot, new slab or None, pickle))``
        unless its storages exceed ``SLAB_MAX_BYTES``; other messages are pickled as is.
        """
        kind, batch = message
        if kind != "step":
            return bytes(ForkingPickler.dumps(message))
        slot = self._acquire(stop)
        if slot is None:
            return None
        try:
            encoded = self._write(slot, batch)
        except BaseException:
            self._free.add(slot)
            raise
        if encoded is None:
            self._free.add(slot)
            return bytes(ForkingPickler.dumps(message))
        return encoded

    def end_epoch(self) -> None:
        """Drop the slabs after an epoch's end was sent; the next epoch allocates anew.

        The trainer drops its copies when it reads the end (:meth:`SlabReader.end_epoch`),
        so an idle collate side and its trainer hold no shared memory between epochs.
        """
        self._slabs = [None] * len(self._slabs)

    def _acquire(self, stop: Any) -> int | None:
        """The lowest free slot, waiting for the trainer to return one; None once stopped."""
        try:
            while True:
                while self._returns.poll():
                    self._free.add(int.from_bytes(self._returns.recv_bytes(), "little"))
                if self._free:
                    slot = min(self._free)
                    self._free.remove(slot)
                    return slot
                if stop.is_set():
                    return None
                self._returns.poll(_RETURN_POLL_S)
        except (EOFError, OSError):  # the trainer closed its end: it stopped listening
            return None

    def _write(self, slot: int, batch: Any) -> bytes | None:
        """Copy the batch's storages into the slot's slab; None when they are too big."""
        buffer = io.BytesIO()
        pickler = _SlabPickler(buffer)
        pickler.dump(batch)
        if pickler.end > SLAB_MAX_BYTES:
            return None
        slab, fresh = self._slabs[slot], None
        if slab is None or slab.numel() < pickler.end:
            slab = fresh = _new_slab(pickler.end)
            self._slabs[slot] = slab
        target = slab.numpy()
        for storage, offset in pickler.placed:
            _copy(storage_bytes(storage).numpy(), target[offset : offset + storage.nbytes()])
        return bytes(ForkingPickler.dumps(("slab", (slot, fresh, buffer.getvalue()))))


def _copy(source: np.ndarray, target: np.ndarray) -> None:
    """Copy bytes with a plain memcpy on this thread.

    torch's ``clone`` of a ~64 KiB ``uint8`` slice measured ~2 ms per call on two busy
    cores (presumably its intra-op thread pool); a whole batch now decodes in ~0.07 ms.
    """
    np.copyto(target, source, casting="no")


def _new_slab(needed: int) -> torch.Tensor:
    size = max(SLAB_MIN_BYTES, min(SLAB_MAX_BYTES, needed * 5 // 4), needed)
    return torch.empty(_aligned(size), dtype=torch.uint8).share_memory_()


def _aligned(offset: int) -> int:
    return -(-offset // SLAB_ALIGN) * SLAB_ALIGN


class _SlabPickler(ForkingPickler):
    """Pickles a batch with its plain CPU tensors' storages as slab offsets.

    Each distinct storage not in shared memory already gets an aligned place from offset
    0 (``placed``; ``end`` is the bytes needed) and is pickled as the persistent id
    ``(offset, nbytes)``; the caller copies the storages in. Shared storages, other
    tensors and other objects pickle as with ForkingPickler.
    """

    def __init__(self, file: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}
        self._offsets: dict[int, int] = {}
        self.placed: list[tuple[torch.UntypedStorage, int]] = []
        self.end = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return reduce_plain_tensor(obj, self._storages) or NotImplemented
        return NotImplemented

    def persistent_id(self, obj: Any) -> tuple[int, int] | None:
        if type(obj) is not torch.UntypedStorage or obj.device.type != "cpu" or obj.is_shared():
            return None  # shared storages cross by descriptor, without a copy
        offset = self._offsets.get(id(obj))
        if offset is None:
            offset = self._offsets[id(obj)] = self.end
            self.placed.append((obj, offset))  # also keeps id(obj) unique while pickling
            self.end = _aligned(offset + obj.nbytes())
        return offset, obj.nbytes()


class SlabReader:
    """Trainer side of the hand-off: copies each batch out of its slab, returns the slot.

    Holds the slabs the collate process sent (one per slot) until :meth:`close`. A
    decoded batch owns its memory: it shares nothing with the slab, so the consumer may
    keep it after the slot is reused.
    """

    def __init__(self, returns: Connection, slots: int) -> None:
        self._returns = returns
        self._slabs: list[torch.Tensor | None] = [None] * slots

    def decode(self, slot: int, fresh: torch.Tensor | None, blob: bytes) -> Any:
        """The batch pickled in ``blob`` over slot ``slot`` (whose slab is ``fresh`` if new)."""
        if fresh is not None:
            self._slabs[slot] = fresh
        try:
            return _SlabUnpickler(io.BytesIO(blob), self._slabs[slot]).load()
        finally:
            with contextlib.suppress(OSError):  # the collate process is gone
                self._returns.send_bytes(slot.to_bytes(4, "little"))

    def end_epoch(self) -> None:
        """Drop the slabs at an epoch's end (every batch before it was decoded)."""
        self._slabs = [None] * len(self._slabs)

    def close(self) -> None:
        """Drop the slabs (their memory goes with the last holder) and the return pipe."""
        self._slabs = []
        self._returns.close()


class _SlabUnpickler(pickle.Unpickler):
    """Rebuilds each slab storage as a private copy (views of one storage stay shared)."""

    def __init__(self, file: Any, slab: torch.Tensor | None) -> None:
        super().__init__(file)
        self._slab = slab
        self._storages: dict[int, torch.UntypedStorage] = {}

    def persistent_load(self, pid: tuple[int, int]) -> torch.UntypedStorage:
        offset, nbytes = pid
        storage = self._storages.get(offset)
        if storage is None:
            assert self._slab is not None, "a batch arrived over a slot with no slab"
            copy = torch.empty(nbytes, dtype=torch.uint8)
            _copy(self._slab.numpy()[offset : offset + nbytes], copy.numpy())
            storage = self._storages[offset] = copy.untyped_storage()
        return storage
