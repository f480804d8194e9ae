"""Streams that say how they shard themselves, read from the library that built them.

ODB must not shard a stream a second time: a stream that already yields only its
rank's items (``datasets.distributed.split_dataset_by_node``) or only its DataLoader
worker's items (every Hugging Face ``datasets.IterableDataset`` splits its shards over
workers by ``get_worker_info``) would lose 1/W or 1/K of its items. Only what a
library states is used here; any other stream must say it through ``shard=``.

Tracks ``datasets`` 5.x: the class ``datasets.iterable_dataset.IterableDataset`` and its
``_distributed`` attribute (set by ``split_dataset_by_node``; a private name, which is
why it is read in this one module and checked by ``tests/odb/core/test_sharding.py``).
"""

from __future__ import annotations

from typing import Any


def declared_shard(dataset: Any) -> str | None:
    """``"worker"``, ``"rank_worker"`` or None (the dataset says nothing ODB can read).

    Example:
        >>> declared_shard([1, 2, 3]) is None
        True
    """
    for klass in type(dataset).__mro__:
        if klass.__module__ == "datasets.iterable_dataset" and klass.__name__ == "IterableDataset":
            return "rank_worker" if getattr(dataset, "_distributed", None) else "worker"
    return None
