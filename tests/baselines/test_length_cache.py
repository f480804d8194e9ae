"""The offline length cache: one full pass, fingerprinted, stale caches refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baselines import BaselineConfig, GMTLoader, LengthCache, SortedLoader, StaleCacheError
from baselines.length_cache import build, main, resolve_lengths
from tests.baselines.toy import ToyDataset


def test_build_records_lengths_fingerprint_and_build_time(tmp_path: Path) -> None:
    ds = ToyDataset(30)
    cache = build(ds)
    assert list(cache.lengths) == [len(ds[i]["input_ids"]) for i in range(30)]
    assert cache.patches == (0,) * 30
    assert cache.fingerprint == ds.fingerprint() and cache.build_seconds >= 0
    size = cache.save(tmp_path / "c.json")
    assert size == (tmp_path / "c.json").stat().st_size > 0
    assert LengthCache.load(tmp_path / "c.json", ds) == cache


def test_repeated_build_times_every_pass_and_keeps_the_first_as_the_build_time(
    tmp_path: Path,
) -> None:
    ds = ToyDataset(16, augment=True)
    cache = build(ds, epoch=1, repeats=3)
    assert cache.lengths == build(ds, epoch=1).lengths
    assert len(cache.build_timings) == 3 and cache.build_seconds == cache.build_timings[0]
    cache.save(tmp_path / "c.json")
    assert LengthCache.load(tmp_path / "c.json", ds) == cache
    assert cache.describe()["build_timings"] == list(cache.build_timings)
    single = build(ds)  # one pass: one timing
    assert single.build_timings == (single.build_seconds,)
    older = {k: v for k, v in cache.to_dict().items() if k != "build_timings"}  # older file
    (tmp_path / "old.json").write_text(json.dumps(older))
    assert LengthCache.load(tmp_path / "old.json").build_timings == (cache.build_seconds,)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        build(ds, repeats=0)


class _Drifting(ToyDataset):
    """A dataset whose lengths change from one pass to the next (not deterministic)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.reads = 0

    def __getitem__(self, index: int) -> dict:
        self.reads += 1
        sample = dict(super().__getitem__(index))
        sample["input_ids"] = sample["input_ids"][: 1 + (self.reads // len(self)) % 2 + index % 3]
        return sample


def test_repeated_build_refuses_a_dataset_whose_lengths_differ_between_passes() -> None:
    with pytest.raises(RuntimeError, match="pass 1 of the dataset gave other lengths"):
        build(_Drifting(6), repeats=2)


@pytest.mark.dist
def test_build_with_workers_equals_in_process() -> None:
    ds = ToyDataset(12, augment=True)
    assert build(ds, epoch=2, num_workers=2).lengths == build(ds, epoch=2).lengths


def test_stale_cache_is_refused_with_the_rebuild_command(tmp_path: Path) -> None:
    path = tmp_path / "toy.json"
    record = main(
        [
            "build",
            "--out",
            str(path),
            "--factory",
            "tests.baselines.toy:make_toy",
            "--kwargs",
            json.dumps({"n": 20, "seed": 1}),
        ]
    )
    assert record["num_samples"] == 20 and record["size_bytes"] > 0
    assert LengthCache.load(path, ToyDataset(20, seed=1)).num_samples == 20
    changed = ToyDataset(20, seed=1, augment=True)  # the pipeline changed: new fingerprint
    with pytest.raises(StaleCacheError, match="stale") as err:
        LengthCache.load(path, changed)
    assert "python -m baselines.length_cache build --out" in str(err.value)
    assert "tests.baselines.toy:make_toy" in str(err.value)
    cache = LengthCache.load(path)
    with pytest.raises(StaleCacheError, match="stale"):
        GMTLoader(changed, BaselineConfig(token_budget=256), lengths=cache)
    info = main(["info", str(path)])
    assert info["fingerprint"] == cache.fingerprint and info["size_bytes"] > 0


def test_cache_of_another_size_is_refused() -> None:
    cache = build(ToyDataset(10))
    with pytest.raises(StaleCacheError, match="10 samples"):
        cache.check_fingerprint(cache.fingerprint, 11)


def test_instantiate_targets_in_kwargs(tmp_path: Path) -> None:
    # Nested targets are built first, and their results passed on.
    kwargs = {"n": {"_target_": "tests.baselines.toy:as_int", "value": "7"}}
    record = main(
        [
            "build",
            "--out",
            str(tmp_path / "c.json"),
            "--factory",
            "tests.baselines.toy.make_toy",
            "--kwargs",
            json.dumps(kwargs),
        ]
    )
    assert record["num_samples"] == 7


def test_dataset_without_fingerprint_is_refused() -> None:
    with pytest.raises(TypeError, match="fingerprint"):
        build([{"input_ids": [1]}])


def test_lengths_from_a_proxy_or_a_list() -> None:
    ds = ToyDataset(8)
    lengths, patches = resolve_lengths(lambda i: i + 1, ds)
    assert lengths == tuple(range(1, 9)) and patches is None
    with pytest.raises(ValueError, match="8 samples"):
        resolve_lengths([1, 2], ds)
    with pytest.raises(ValueError, match="length < 1"):
        resolve_lengths([0] * 8, ds)
    loader = SortedLoader(ds, BaselineConfig(token_budget=512, cutoff_len=128), lengths=ds.length)
    assert len(loader) > 0


def test_methods_that_plan_from_lengths_require_them() -> None:
    with pytest.raises(ValueError, match="LengthCache"):
        GMTLoader(ToyDataset(4), BaselineConfig(token_budget=64))
