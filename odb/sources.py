"""Where a rank's samples come from: its view of a map-style dataset, or its shard of a stream.

Both run the user's dataset in DataLoader workers with a null collate, so each item
is one ``(index, sample)`` pair (public ``torch.utils.data`` API only).

* Map-style: the view is an explicit list of dataset indices (``odb.sharding``).
* Stream (``IterableDataset``, no ``len``): the index of an item is its position in
  the stream. Rank ``r`` of ``W`` takes positions ``p`` with ``p % W == r``; among those,
  worker ``w`` of ``K`` takes the ``j``-th when ``j % K == w``. Positions listed in
  ``skip`` (already consumed before a resume) are passed over. Every worker iterates
  the whole stream and discards what is not its own, so an expensive stream should do
  its heavy work lazily, after this selection (e.g. in ``__getitem__``-like mapping
  done on the yielded item), or shard itself at the source.

A worker pickles each item itself (:class:`WorkerPickle`). For a collate *process*,
tensor storages up to ``_INLINE_MAX_BYTES`` travel as bytes inside the pickle instead
of one shared-memory segment and one descriptor handshake each.
:func:`reduce_plain_tensor` and :func:`rebuild_tensor` are shared with the trainer
hand-off (:mod:`odb.runner`).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from odb.config import ODBConfig
from odb.forking import context_for, trainer_start_method


class ViewDataset(Dataset):
    """Map-style view: item ``i`` is ``(view[i], dataset[view[i]])``."""

    def __init__(self, dataset: Any, view: list[int]) -> None:
        self.dataset = dataset
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        index = self.view[i]
        return index, self.dataset[index]


class StreamShard(IterableDataset):
    """This rank's (and this worker's) items of a stream, as ``(identity, item)``.

    ``shard`` says who splits the stream (``odb.sharding``). Where ODB splits over
    workers (``"odb"``, ``"rank"``) every worker iterates the same stream and the identity
    is the position ``p`` in it; worker ``w`` of ``K`` keeps its share of the positions
    this rank keeps. Where the stream splits itself over workers (``"worker"``,
    ``"rank_worker"``) each worker sees its own sub-stream: the identity of its ``j``-th
    item is ``j * K + w``. Where ODB splits over ranks (``"odb"``, ``"worker"``) rank
    ``r`` of ``W`` keeps the items whose position (in its worker's stream) is ``r`` mod
    ``W``. Identities in ``skip`` (consumed before a resume) are passed over.
    """

    def __init__(
        self, dataset: Any, rank: int, world_size: int, skip: frozenset[int], shard: str = "odb"
    ) -> None:
        self.dataset = dataset
        self.rank = rank if shard in ("odb", "worker") else 0
        self.world_size = world_size if shard in ("odb", "worker") else 1
        self.split_workers = shard in ("odb", "rank")
        self.skip = skip

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        worker = get_worker_info()
        worker_id, workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        for position, item in enumerate(self.dataset):
            if position % self.world_size != self.rank:
                continue
            if self.split_workers:
                if (position // self.world_size) % workers != worker_id:
                    continue
                identity = position
            else:
                identity = position * workers + worker_id
            if identity not in self.skip:
                yield identity, item


# A storage up to this size travels from a worker inside the pickled item; a larger one
# through torch's shared memory. Measured (2 workers, one int64 tensor per item): bytes
# are 3x faster at 16 KiB and 1.5x at 256 KiB, shared memory 1.3x faster at 1 MiB.
_INLINE_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class WorkerPickle:
    """The DataLoader's collate: pass one item through, pickled already in a worker.

    The collate side groups items itself and receives each item as it was. In a worker
    the item is pickled at once, so one that cannot be pickled raises there (the
    DataLoader re-raises it) instead of being dropped by the worker's queue thread,
    which left the loader waiting forever.

    With ``inline`` (collate process only) small storages travel as bytes in the pickle.
    A worker killed while it writes a message longer than a pipe write can leave half a
    message in the DataLoader's result pipe; the DataLoader in a collate process reads it
    in the main thread, where PyTorch's SIGCHLD handler interrupts the read and names the
    dead worker. A collate thread has no such handler and would wait forever, so in
    thread mode tensors keep travelling as shared-memory handles (short messages).
    """

    inline: bool

    def __call__(self, item: Any) -> Any:
        if get_worker_info() is None:
            return item
        pickler = _InlinePickler if self.inline else ForkingPickler
        return _Pickled(bytes(pickler.dumps(item, pickle.HIGHEST_PROTOCOL)))


class _Pickled:
    """An item pickled in a worker; unpickles to the item itself."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Callable[[bytes], Any], tuple[bytes]]:
        return pickle.loads, (self.blob,)


class _InlinePickler(ForkingPickler):
    """ForkingPickler that writes small storages of plain CPU tensors as bytes."""

    def __init__(self, file: Any, protocol: int | None = None) -> None:
        super().__init__(file, protocol)
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return reduce_plain_tensor(obj, self._storages) or NotImplemented
        if (
            type(obj) is torch.UntypedStorage
            and obj.device.type == "cpu"
            and obj.nbytes() <= _INLINE_MAX_BYTES
        ):
            return _storage_from_array, (storage_bytes(obj).numpy(),)
        return NotImplemented


def reduce_plain_tensor(
    tensor: torch.Tensor, storages: dict[tuple[int, int], torch.UntypedStorage]
) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]] | None:
    """``(rebuild_tensor, args)`` for a plain CPU tensor; None for any other tensor.

    Plain: exactly ``torch.Tensor``, strided, on the CPU, without autograd, conjugate or
    negative bits or quantisation. The args hold the tensor's storage object, one
    per distinct storage in ``storages`` (the pickler's memo), so views of one storage
    are rebuilt as views of one storage, with their offsets and strides.
    """
    if not (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.requires_grad
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
    ):
        return None
    storage = tensor.untyped_storage()
    size = storage.nbytes()
    key = (storage.data_ptr(), size) if size else (id(storage), -1)
    storage = storages.setdefault(key, storage)
    layout = (tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
    return rebuild_tensor, (storage, tensor.dtype, *layout)


def rebuild_tensor(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
) -> torch.Tensor:
    """The tensor :func:`reduce_plain_tensor` described, over ``storage``."""
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A ``uint8`` tensor over all bytes of ``storage`` (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _storage_from_array(array: np.ndarray) -> torch.UntypedStorage:
    return torch.from_numpy(array).untyped_storage()


def is_stream(dataset: Any) -> bool:
    """True for datasets read by iteration (no random access by index)."""
    return isinstance(dataset, IterableDataset)


def open_samples(
    dataset: Any,
    config: ODBConfig,
    rank: int,
    world_size: int,
    view: list[int] | None,
    skip: frozenset[int],
    shard: str = "odb",
    worker_init_fn: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Iterate this rank's ``(index, sample)`` pairs through DataLoader workers."""
    source = (
        StreamShard(dataset, rank, world_size, skip, shard)
        if view is None
        else ViewDataset(dataset, view)
    )
    loader = DataLoader(
        source,
        batch_size=None,
        shuffle=False,
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor,
        collate_fn=WorkerPickle(inline=config.collate_mode == "process"),
        multiprocessing_context=_worker_context(config),
        worker_init_fn=worker_init_fn,
        timeout=config.worker_timeout_s if config.num_workers else 0,
    )
    return iter(loader)


def _worker_context(config: ODBConfig) -> mp.context.BaseContext | None:
    """How the DataLoader workers start; a fork is always the checked one.

    A spawned collate process inherits the spawn start method, so without this its
    workers would each pay a fresh interpreter and torch import per epoch (measured:
    startup 3.4 s -> 1.4 s, docs/benchmarks.md): a collate *process* forks them where
    the platform can. The collate side starts its workers before it builds the
    alignment group, so no Gloo thread or socket of its own is forked (a forked collate
    process has let go of the trainer's, ``leave_trainer``). In thread mode the workers
    start the way the trainer's start method says. Every fork goes through
    :func:`odb.forking.checked_fork_context`: the workers fork from a process that runs
    threads, and a child the interpreter deadlocks at the fork is forked again.
    """
    if config.num_workers == 0:
        return None
    if config.worker_start_method is not None:
        method = config.worker_start_method
    elif config.collate_mode == "process" and "fork" in mp.get_all_start_methods():
        method = "fork"
    else:
        method = trainer_start_method()
    return context_for(method)


def idle_template(dataset: Any) -> Callable[[], Any]:
    """A sample to build IDLE steps from when a rank read none this epoch."""

    def template() -> Any:
        if is_stream(dataset):
            for item in dataset:
                return item
        elif len(dataset):
            return dataset[0]
        raise ValueError("ODB needs a sample to build IDLE steps, but the dataset is empty")

    return template
