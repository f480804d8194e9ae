"""Who reads which sample: per-epoch views, the ``shard`` decision and its cross-rank check.

Like ``DistributedSampler`` but without padding duplicates: with ``shard="odb"`` the
epoch order (the seeded permutation of ``seed + epoch``, or a global sampler's order) is
dealt round-robin, so views differ in size by at most one and their union is every
index exactly once. Every rank computes the same order. The other modes leave the
split between ranks (and, for streams, between DataLoader workers) to the data
(``docs/resume.md``, "Who shards"). Pure: no ``torch.distributed``, no processes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's global order of dataset indices."""
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def rank_view(
    num_samples: int, rank: int, world_size: int, *, seed: int, epoch: int, shuffle: bool
) -> list[int]:
    """Indices rank ``rank`` reads this epoch, in reading order.

    Example:
        >>> rank_view(5, 1, 2, seed=0, epoch=0, shuffle=False)
        [1, 3]
    """
    if not 0 <= rank < world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )
    return epoch_order(num_samples, seed, epoch, shuffle)[rank::world_size]


# Who decides which samples a rank reads (``ODBConfig.shard`` once resolved).
SHARDS: tuple[str, ...] = ("odb", "rank", "worker", "rank_worker")
MAP_SHARDS: tuple[str, ...] = ("odb", "rank")
# Fields of the one-per-epoch source row the collate sides all-gather before reading.
SOURCE_ROW_WIDTH = 4


@dataclass(frozen=True)
class SourceFacts:
    """What a rank knows about its samples' source when it resolves ``shard="auto"``.

    Attributes:
        stream: The dataset is read by iteration.
        sampler: ``None`` (no sampler), ``"distributed"`` (a ``DistributedSampler``,
            which is per rank) or ``"other"`` (any other sampler or index iterable).
        declared: What the dataset says about its own sharding (:mod:`odb.core.detect`).
        world_size: Ranks of the trainer.
        num_workers: DataLoader workers per rank.
    """

    stream: bool
    sampler: str | None
    declared: str | None
    world_size: int
    num_workers: int


def resolve_shard(shard: str, facts: SourceFacts) -> str:
    """The sharding to use: ``shard`` itself, checked, or what ``"auto"`` picks.

    ``"auto"`` never picks a mode that can lose samples silently: a map-style dataset
    without a sampler is dealt by ODB (the ranks' dataset sizes and epoch orders are
    compared at every epoch, :func:`check_source_rows`), a ``DistributedSampler`` is per rank,
    a stream that declares its sharding is taken at its word, and where ODB cannot tell
    (another sampler, or an undeclared stream, with more than one rank or worker) it
    refuses and asks.

    Example:
        >>> resolve_shard("auto", SourceFacts(False, None, None, 2, 0))
        'odb'
    """
    where = "sampler" if facts.sampler else ("stream" if facts.stream else "dataset")
    if shard != "auto":
        allowed = SHARDS if facts.stream else MAP_SHARDS
        if shard not in allowed:
            raise ValueError(
                f"shard={shard!r} does not apply to a map-style dataset: it is for streams "
                f"that shard themselves over DataLoader workers. Use one of {allowed}"
            )
        if facts.declared is not None and shard != facts.declared:
            raise ValueError(
                f"the dataset declares that it shards itself as shard={facts.declared!r} "
                f"(see odb/core/detect.py), but shard={shard!r} was given: ODB would shard it "
                "a second time (losing samples) or not enough (repeating them). Leave "
                "shard='auto' or pass the declared value"
            )
        if facts.sampler == "distributed" and shard == "odb":
            raise ValueError(
                "a DistributedSampler already gives each rank its own indices; with "
                "shard='odb' ODB would deal them again and each rank would read 1/W of "
                "its share. Use shard='rank' (or 'auto')"
            )
        return shard
    if facts.declared is not None:
        return facts.declared
    if facts.sampler == "distributed":
        return "rank"
    unsure = facts.world_size > 1 or (facts.stream and facts.num_workers > 1)
    if not unsure or (not facts.stream and facts.sampler is None):
        return "odb"
    if facts.stream:
        raise ValueError(
            f"ODB cannot tell whether this stream ({facts.world_size} ranks, "
            f"{facts.num_workers} workers per rank) shards itself. Say who does: "
            "shard='odb' (it yields the same items on every rank and worker; ODB deals "
            "them), 'rank' (it already yields only this rank's items, e.g. "
            "split_dataset_by_node or a node splitter), 'worker' (it splits itself over "
            "DataLoader workers via get_worker_info) or 'rank_worker' (both)"
        )
    raise ValueError(
        f"ODB cannot tell whether this {where} is global or per rank ({facts.world_size} "
        "ranks). Say who shards: shard='odb' (every rank holds the same sampler with the "
        "same order; ODB deals its indices) or shard='rank' (each rank's sampler already "
        "yields only that rank's indices)"
    )


def order_fingerprint(order: list[int]) -> int:
    """A 63-bit digest of an epoch order, to compare orders across ranks cheaply."""
    data = torch.tensor(order, dtype=torch.int64).numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def source_row(shard: str, num_samples: int | None, order: list[int] | None) -> list[int]:
    """This rank's source row: ``[shard, dataset size, epoch size, order digest]`` (-1: none)."""
    return [
        SHARDS.index(shard),
        -1 if num_samples is None else num_samples,
        -1 if order is None else len(order),
        0 if order is None else order_fingerprint(order),
    ]


def check_source_rows(rows: list[list[int]]) -> int | None:
    """Refuse, before any sample is read, an epoch whose ranks disagree on their source.

    Pure and evaluated on the same gathered rows by every rank, so every rank raises the
    same error (none waits for a peer). Returns the epoch's sample count over all
    ranks (None for streams).

    Raises:
        ValueError: The ranks use different sharding, or with ODB dealing one global
            dataset (``shard="odb"``) their dataset sizes or epoch orders differ, which
            means the datasets (or samplers) are not the same on every rank.
    """
    shards = [SHARDS[row[0]] for row in rows]
    if len(set(shards)) > 1:
        raise ValueError(f"ranks resolved different shard modes {shards}; set shard= explicitly")
    sizes = [row[1] for row in rows]
    if shards[0] == "odb" and len(set(sizes)) > 1:
        raise ValueError(
            f"with shard='odb' every rank must hold the same global dataset, but the ranks' "
            f"datasets have {sizes} samples (rank order). If each rank holds its own shard "
            "(pre-sharded data), pass shard='rank' and every rank reads all of its own; "
            "otherwise give every rank the same dataset. (ODB can compare sizes, not "
            "contents: equal-sized per-rank shards need shard='rank' said explicitly.)"
        )
    if shards[0] == "odb" and len({row[3] for row in rows}) > 1:
        raise ValueError(
            "with shard='odb' every rank must use the same epoch order, but the ranks' "
            "orders differ (a sampler or seed that is not the same on every rank). Seed a "
            "global sampler identically on every rank and call set_epoch on the loader, "
            "give every rank the same seed, or pass shard='rank' if each rank's sampler "
            "yields its own indices"
        )
    lengths = [row[2] for row in rows]
    if lengths[0] < 0:
        return None
    return lengths[0] if shards[0] == "odb" else sum(lengths)
