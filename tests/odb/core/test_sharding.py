"""Who reads which sample: the sampler / shard seam never loses or repeats data silently.

Pure checks of ``odb.core.sharding`` and ``odb.core.detect``, then real loaders: a user's sampler,
per-rank (pre-sharded) datasets, pre-sharded and self-sharding streams (Hugging Face
``datasets``), each read whole and once, or refused with a clear error before the
first step.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest
import torch
from torch.utils.data import DistributedSampler, IterableDataset, SubsetRandomSampler

import odb
from harness.scenarios import LengthDataset
from odb.core.detect import declared_shard
from odb.core.resume import LoaderState
from odb.core.sharding import SourceFacts, check_source_rows, resolve_shard, source_row
from tests.odb.rank_calls import LazyCalls, run_calls

OPTIONS = dict(token_budget=256, buffer_budgets=2, queue_depth=2, collate_mode="thread")
OPTIONS["align_timeout_s"] = 60.0


def _ids(loader: odb.ODBLoader) -> list[int]:
    return [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]


# ---------------------------------------------------------------- pure decisions


def _facts(stream=False, sampler=None, declared=None, world=2, workers=0) -> SourceFacts:
    return SourceFacts(stream, sampler, declared, world, workers)


def test_auto_picks_only_modes_that_cannot_lose_data() -> None:
    assert resolve_shard("auto", _facts()) == "odb"  # sizes and orders checked per epoch
    assert resolve_shard("auto", _facts(sampler="distributed")) == "rank"
    assert resolve_shard("auto", _facts(sampler="other", world=1)) == "odb"
    assert resolve_shard("auto", _facts(stream=True, world=1, workers=1)) == "odb"
    assert resolve_shard("auto", _facts(stream=True, declared="worker", workers=2)) == "worker"
    with pytest.raises(ValueError, match="shard='odb'.*shard='rank'"):
        resolve_shard("auto", _facts(sampler="other"))
    for facts in (_facts(stream=True), _facts(stream=True, world=1, workers=2)):
        with pytest.raises(ValueError, match="cannot tell whether this stream"):
            resolve_shard("auto", facts)


def test_explicit_shard_that_would_lose_data_is_refused() -> None:
    with pytest.raises(ValueError, match="declares"):
        resolve_shard("odb", _facts(stream=True, declared="worker"))
    with pytest.raises(ValueError, match="DistributedSampler"):
        resolve_shard("odb", _facts(sampler="distributed"))
    with pytest.raises(ValueError, match="map-style"):
        resolve_shard("worker", _facts())
    assert resolve_shard("rank", _facts(stream=True, workers=2)) == "rank"


def test_source_check() -> None:
    same = [source_row("odb", 10, list(range(10)))] * 2
    assert check_source_rows(same) == 10
    with pytest.raises(ValueError, match=r"\[600, 700\].*shard='rank'"):
        check_source_rows([source_row("odb", 600, list(range(600))), source_row("odb", 700, [0])])
    with pytest.raises(ValueError, match="orders differ"):
        check_source_rows([source_row("odb", 3, [0, 1, 2]), source_row("odb", 3, [2, 1, 0])])
    assert check_source_rows([source_row("rank", 6, [0, 1]), source_row("rank", 9, [0, 1, 2])]) == 5
    assert check_source_rows([source_row("worker", None, None)] * 3) is None


def test_remaining_follows_a_sampler_order() -> None:
    state = LoaderState(0, 10, 0, False, consumed=(4, 7))
    assert state.remaining([7, 4, 2, 9]) == [2, 9]
    # A with-replacement draw: the rest of the epoch is the remaining quota.
    assert state.remaining([1, 1, 1, 1]) == [1, 1]


def _hf_items(parts: list[int], n: int, shards: int):
    for part in parts:
        for i in range(part, n, shards):
            yield {"input_ids": [3] * (i % 37 + 1), "labels": [3] * (i % 37 + 1), "index": [i]}


def _hf_stream(n: int, shards: int):
    """A Hugging Face stream of ``shards`` shards (it splits them over workers itself)."""
    datasets = pytest.importorskip("datasets")
    kwargs = {"parts": list(range(shards)), "n": n, "shards": shards}
    return datasets.IterableDataset.from_generator(_hf_items, gen_kwargs=kwargs).with_format(
        "torch"
    )


def test_detects_hugging_face_streams() -> None:
    from datasets.distributed import split_dataset_by_node

    stream = _hf_stream(10, 2)
    assert declared_shard(stream) == "worker"
    assert declared_shard(split_dataset_by_node(stream, rank=0, world_size=2)) == "rank_worker"
    assert declared_shard(LengthDataset([1, 2])) is None


# ---------------------------------------------------------------- one rank

LENGTHS = [(i * 23) % 140 + 1 for i in range(41)]


def test_subset_sampler_emits_exactly_its_subset() -> None:
    sampler = SubsetRandomSampler([0, 1, 2], generator=torch.Generator().manual_seed(0))
    loader = odb.ODBLoader(LengthDataset(LENGTHS), sampler=sampler, **OPTIONS)
    assert sorted(_ids(loader)) == [0, 1, 2]
    assert loader.progress() == 1.0


class _EpochSampler:
    """An index iterable whose order depends on the epoch it is told (set_epoch)."""

    def __init__(self, indices: list[int]) -> None:
        self.indices, self.epoch = indices, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        shift = self.epoch % len(self.indices)
        return iter(self.indices[shift:] + self.indices[:shift])


def test_sampler_gets_set_epoch_and_resume_is_exactly_once() -> None:
    sampler = _EpochSampler([5, 9, 11, 20, 30, 31, 40])
    loader = odb.ODBLoader(LengthDataset(LENGTHS), sampler=sampler, **OPTIONS)
    loader.set_epoch(3)
    assert sampler.epoch == 3
    seen = []
    for batch in loader:
        seen += odb.pop_step_info(batch).sample_ids
        break
    fresh = odb.ODBLoader(LengthDataset(LENGTHS), sampler=_EpochSampler(sampler.indices), **OPTIONS)
    fresh.load_state_dict(loader.state_dict())
    fresh.set_epoch(3)
    assert sorted(seen + _ids(fresh)) == sampler.indices


def test_bad_sampler_values_are_refused() -> None:
    loader = odb.ODBLoader(LengthDataset(LENGTHS), sampler=[0, 99], **OPTIONS)
    with pytest.raises(ValueError, match=r"yielded 99.*\[0, 40\]"):
        _ids(loader)
    with pytest.raises(TypeError, match="sampler must be"):
        odb.ODBLoader(LengthDataset(LENGTHS), sampler=3, **OPTIONS)


@pytest.mark.dist
def test_hf_stream_sharded_by_two_workers_loses_nothing() -> None:
    loader = odb.ODBLoader(_hf_stream(60, 2), num_workers=2, **OPTIONS)
    assert loader.shard == "worker"
    assert sorted(_ids_by_field(loader)) == list(range(60))


def _ids_by_field(loader: odb.ODBLoader) -> list[int]:
    out = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        if not info.idle:
            out += batch["index"].flatten().tolist()
    return out


# ---------------------------------------------------------------- real ranks


def _rank_lengths(rank: int, sizes: list[int]) -> list[int]:
    return [(i * 13 + rank * 7) % 120 + 1 for i in range(sizes[rank])]


def _per_rank_dataset(rank: int, world_size: int, sizes: list[int], shard: str | None):
    options = dict(OPTIONS, shard=shard) if shard else OPTIONS
    loader = odb.ODBLoader(LengthDataset(_rank_lengths(rank, sizes)), **options)
    try:
        ids = _ids(loader)
    except ValueError as exc:
        return "error", str(exc)
    return "ok", ids, loader.progress()


@pytest.mark.dist
@pytest.mark.parametrize("sizes", [[600, 700], [30, 45, 30, 12]])
def test_per_rank_datasets_default_is_a_clear_error_before_the_first_step(
        real_ranks: LazyCalls, sizes: list[int]) -> None:
    results = real_ranks[("per_rank", None, tuple(sizes))]
    for result in results:
        assert result[0] == "error", "per-rank datasets of different sizes read silently"
        assert str(sizes) in result[1] and "shard='rank'" in result[1]


@pytest.mark.dist
@pytest.mark.parametrize("sizes", [[60, 75], [30, 45, 30, 12]])
def test_per_rank_datasets_with_shard_rank_are_read_whole_and_once(
        real_ranks: LazyCalls, sizes: list[int]) -> None:
    results = real_ranks[("per_rank", "rank", tuple(sizes))]
    for rank, (status, ids, progress) in enumerate(results):
        assert status == "ok" and sorted(ids) == list(range(sizes[rank])), rank
        assert progress == 1.0  # over the sum of every rank's own data


def _distributed_sampler(rank: int, world_size: int) -> list[int]:
    dataset = LengthDataset(LENGTHS[:40])
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = odb.ODBLoader(dataset, sampler=sampler, **OPTIONS)
    assert loader.shard == "rank"
    loader.set_epoch(1)
    return _ids(loader)


def _global_sampler(rank: int, world_size: int, per_rank_order: bool) -> tuple:
    generator = torch.Generator().manual_seed(rank if per_rank_order else 7)
    order = torch.randperm(len(LENGTHS), generator=generator).tolist()
    try:
        loader = odb.ODBLoader(LengthDataset(LENGTHS), sampler=order, shard="odb", **OPTIONS)
        return "ok", _ids(loader)
    except ValueError as exc:
        return "error", str(exc)


@pytest.mark.dist
def test_samplers_on_real_ranks(real_ranks: LazyCalls) -> None:
    ids = real_ranks["distributed_sampler"]
    assert sorted(ids[0] + ids[1]) == list(range(40))
    ok = real_ranks[("global_sampler", False)]
    assert sorted(ok[0][1] + ok[1][1]) == list(range(len(LENGTHS)))
    bad = real_ranks[("global_sampler", True)]
    assert all(status == "error" and "orders differ" in text for status, text in bad)


class _OwnStream(IterableDataset):
    """Rank ``r``'s own stream (pre-sharded): its items carry ``r * 1000 + position``."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.n = rank, n

    def __iter__(self):
        for p in range(self.n):
            ids = torch.arange(p % 50 + 1) + 3
            yield {"input_ids": ids, "labels": ids.clone(), "index": torch.tensor([p])}


def _pre_sharded_stream(rank: int, world_size: int) -> list[int]:
    loader = odb.ODBLoader(_OwnStream(rank, 30 + 11 * rank), shard="rank", num_workers=2, **OPTIONS)
    return [rank * 1000 + i for i in _ids_by_field(loader)]


def _hf_ranks(rank: int, world_size: int, split: bool) -> list[int]:
    from datasets.distributed import split_dataset_by_node

    stream = _hf_stream(80, 4)
    if split:
        stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
    loader = odb.ODBLoader(stream, num_workers=2, **OPTIONS)
    assert loader.shard == ("rank_worker" if split else "worker")
    return _ids_by_field(loader)


@pytest.mark.dist
def test_streams_on_real_ranks_are_read_whole_and_once(real_ranks: LazyCalls) -> None:
    own, unsplit = real_ranks["pre_sharded_stream"], real_ranks[("hf_stream", False)]
    split = real_ranks[("hf_stream", True)]
    assert sorted(own[0]) == list(range(30)) and sorted(own[1]) == [1000 + p for p in range(41)]
    assert sorted(unsplit[0] + unsplit[1]) == list(range(80)), "HF stream, unsplit"
    assert sorted(split[0] + split[1]) == list(range(80)), "HF stream, split by node"


def _rank_resume(rank: int, world_size: int, pieces: list[dict] | None) -> tuple:
    loader = odb.ODBLoader(LengthDataset(_rank_lengths(rank, [20, 33])), shard="rank", **OPTIONS)
    if pieces is not None:
        loader.load_state_dict(pieces)
        return _ids(loader), None
    seen = []
    for step, batch in enumerate(loader, start=1):
        seen += odb.pop_step_info(batch).sample_ids
        if step == 2:
            break
    return seen, loader.state_dict()


@pytest.fixture(scope="module")
def real_ranks() -> LazyCalls:
    """Every real-rank case of this module, run when a test first asks for one: per key,
    its ranks' returns. One spawn per world size (2 and 4), not one per case: each spawn
    imports torch and datasets again."""
    calls: dict[Hashable, tuple] = {}
    for sizes, shard in (([600, 700], None), ([30, 45, 30, 12], None), ([60, 75], "rank"),
                         ([30, 45, 30, 12], "rank")):
        calls[("per_rank", shard, tuple(sizes))] = (len(sizes), _per_rank_dataset,
                                                    (sizes, shard))
    calls["distributed_sampler"] = (2, _distributed_sampler, ())
    calls |= {("global_sampler", bad): (2, _global_sampler, (bad,)) for bad in (False, True)}
    calls["pre_sharded_stream"] = (2, _pre_sharded_stream, ())
    calls |= {("hf_stream", split): (2, _hf_ranks, (split,)) for split in (False, True)}
    calls["rank_resume"] = (2, _rank_resume, (None,))
    return LazyCalls(calls)


@pytest.mark.dist
def test_per_rank_resume_is_exactly_once_at_the_same_world_size(
        real_ranks: LazyCalls) -> None:
    before = real_ranks["rank_resume"]
    pieces = [piece for _, piece in before]
    [after] = run_calls({"after": (2, _rank_resume, (pieces[::-1],))}).values()
    for rank, size in enumerate([20, 33]):
        assert sorted(before[rank][0] + after[rank][0]) == list(range(size))
    with pytest.raises(ValueError, match="only at world size 2"):
        odb.ODBLoader(LengthDataset([5]), shard="rank", **OPTIONS).load_state_dict(pieces)
