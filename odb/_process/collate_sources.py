"""Where a rank's samples come from: its view of a map-style dataset, or its shard of a stream.

Both run the user's dataset in DataLoader workers with a null collate, so each item
is one ``(index, sample)`` pair (public ``torch.utils.data`` API only).

* Map-style: the view is an explicit list of dataset indices (``odb.core.sharding``).
* Stream (``IterableDataset``, no ``len``): the index of an item is its position in
  the stream. Rank ``r`` of ``W`` takes positions ``p`` with ``p % W == r``; among those,
  worker ``w`` of ``K`` takes the ``j``-th when ``j % K == w``. Positions listed in
  ``skip`` (already consumed before a resume) are passed over. Every worker iterates
  the whole stream and discards what is not its own, so an expensive stream should do
  its heavy work lazily, after this selection (e.g. in ``__getitem__``-like mapping
  done on the yielded item), or shard itself at the source.

A worker pickles each item itself (:class:`odb._process.pickling.WorkerPickle`). An epoch
that ends early first receives what its workers owe (:func:`receive_owed`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.worker import _IterableDatasetStopIteration

from odb._process.forking import context_for, trainer_start_method
from odb._process.pickling import WorkerPickle
from odb.core.config import ODBConfig


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

    ``shard`` says who splits the stream (``odb.core.sharding``). Where ODB splits over
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


OWED_S = 0.5
"""The longest an epoch that ends early waits for the items its workers owe.

A stop waits for this on top of the read in progress; the trainer warns after 1 s
(``odb._process.trainer_runner``) and a stopped collate process is killed after 2 s."""


def receive_owed(
    samples: Iterator[Any],
    reading: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    timeout_s: float = OWED_S,
) -> None:
    """Receive and drop every item ``samples``' DataLoader workers were asked for and
    have not delivered, for ``timeout_s`` at most; call it before the workers are shut
    down. ``reading`` wraps the reads (a :meth:`WorkerAlarm.reading`).

    Under ``file_system`` sharing a worker takes a reference on each shared segment of
    an item as it pickles it, and the receiver returns it when it unpickles the item. An
    item never received (still in the result pipe, or in the worker's queue buffer,
    which the worker drops when it is shut down) keeps its segment in ``/dev/shm`` until
    the last process of the rank ends. Every item asked for is in flight at the
    shutdown of an epoch that ends early: a ``break``, a ``close()``, a stop, an error.

    Items already sent are always received; for the rest it waits until the deadline.
    It gives up on them, leaving them as before, at the deadline or when a worker is
    found dead (its messages died with it). Without workers, or once shut down, does
    nothing.
    """
    owed = _owed_tasks(samples)
    deadline = time.monotonic() + timeout_s
    try:
        with reading():
            while owed:
                left = max(deadline - time.monotonic(), 0.0)
                received, message = samples._try_get_data(left)  # type: ignore[attr-defined]
                if not received:
                    return
                task, item = message
                owed.pop(task, None)
                if isinstance(item, _IterableDatasetStopIteration):  # it skips the rest
                    owed = {t: w for t, w in owed.items() if w != item.worker_id}
    except Exception:  # noqa: BLE001 - a dead worker or a broken message: nothing more comes
        return


def _owed_tasks(samples: Iterator[Any]) -> dict[int, int]:
    """``{task: worker}`` of the items asked of live workers and not yet received.

    Reads the multi-worker iterator's bookkeeping (torch 2.x ``_task_info``: task to
    ``(worker,)`` until its item arrives, ``_workers_status``: whether a worker still
    takes tasks); an iterator without it owes nothing.
    """
    info = getattr(samples, "_task_info", None)
    status = getattr(samples, "_workers_status", None)
    if info is None or status is None or getattr(samples, "_shutdown", True):
        return {}
    return {task: got[0] for task, got in info.items() if len(got) == 1 and status[got[0]]}


def _worker_context(config: ODBConfig) -> mp.context.BaseContext | None:
    """How the DataLoader workers start; a fork is always the checked one.

    A spawned collate process inherits the spawn start method, so without this its
    workers would each pay a fresh interpreter and torch import per epoch (figures:
    docs/benchmarks.md, "Hand-off design figures"): a collate *process* forks them where
    the platform can. The collate side starts its workers before it builds the
    alignment group, so no Gloo thread or socket of its own is forked (a forked collate
    process has let go of the trainer's, ``leave_trainer``). In thread mode the workers
    start the way the trainer's start method says. Every fork goes through
    :func:`odb._process.forking.checked_fork_context`: the workers fork from a process that runs
    threads, and a child the interpreter deadlocks at the fork is forked again.
    """
    if config.num_workers == 0:
        return None
    if config.worker_start_method is not None:
        method: str = config.worker_start_method
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
