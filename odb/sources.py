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
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from odb.config import ODBConfig


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
    """This rank's (and this worker's) positions of a stream, as ``(position, item)``."""

    def __init__(self, dataset: Any, rank: int, world_size: int, skip: frozenset[int]) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.skip = skip

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        worker = get_worker_info()
        worker_id, workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        for position, item in enumerate(self.dataset):
            if position % self.world_size != self.rank:
                continue
            if (position // self.world_size) % workers != worker_id or position in self.skip:
                continue
            yield position, item


def null_collate(item: Any) -> Any:
    """Pass one item through unchanged (the collate side groups items itself)."""
    return item


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
) -> Iterator[tuple[int, Any]]:
    """Iterate this rank's ``(index, sample)`` pairs through DataLoader workers."""
    source = (
        StreamShard(dataset, rank, world_size, skip) if view is None else ViewDataset(dataset, view)
    )
    loader = DataLoader(
        source,
        batch_size=None,
        shuffle=False,
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor,
        collate_fn=null_collate,
        multiprocessing_context=_worker_context(config),
    )
    return iter(loader)


def _worker_context(config: ODBConfig) -> mp.context.BaseContext | None:
    """Fork the workers of a collate *process* where the platform can.

    A spawned collate process inherits the spawn start method, so without this its
    workers would each pay a fresh interpreter and torch import per epoch (measured:
    startup 3.4 s -> 1.4 s, docs/benchmarks.md). The collate side starts its workers
    before it builds the alignment group, so no Gloo thread or socket is forked. In thread
    mode the workers fork from the trainer process, whose start method stays the user's.
    """
    if (
        config.collate_mode != "process"
        or config.num_workers == 0
        or "fork" not in mp.get_all_start_methods()
    ):
        return None
    return mp.get_context("fork")


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
