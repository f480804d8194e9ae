"""MM-Mix builder: hub-layout parquet in, TMDB folder out, readable by the pipeline."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from experiments.data import mm_mix
from experiments.data.mm_mix import MMMixConfig, allocate, build, source_weights
from experiments.data.mm_mix_rows import SOURCE_CONFIGS, config_dir
from experiments.data.pipeline import PreprocessedDataset
from experiments.data.proxy_lengths import SHORT_THRESHOLD, summary
from experiments.data.proxy_plans import MMMIX_SHARES
from experiments.data.records import DataConfig
from tests.experiments.hub_fixtures import write_mm_mix_sources

RECORDS = 100


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site_cache")
    write_mm_mix_sources(root, rows_per_config=30)
    return root


@pytest.fixture(scope="module")
def mix(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mix") / "mm_mix"
    mm_mix.main(["--cache", str(cache), "--out", str(out), "--records", str(RECORDS),
                 "--seed", "0"])
    return out


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_weights_reuse_the_proxy_shares() -> None:
    w = source_weights()
    assert sum(w.values()) == pytest.approx(1.0)
    for role, share in MMMIX_SHARES.items():
        assert sum(v for s, v in w.items() if mm_mix.role_of(s) == role) == pytest.approx(share)
    w = source_weights(0.6)
    assert w["iiit5k"] + w["orand_car_a"] + w["aokvqa"] == pytest.approx(0.6)
    assert w["aokvqa"] / w["iiit5k"] == pytest.approx(0.4)  # OCR:VQA kept at 0.40:0.08


def test_layout_and_metadata(mix: Path, cache: Path) -> None:
    meta = json.loads((mix / "metadata.json").read_text())
    records = _records(mix)
    assert meta["num_records"] == len(records) == RECORDS
    assert sorted(p.name for p in mix.iterdir()) == ["images", "metadata.json", "records.jsonl"]
    assert meta["builder_version"] == mm_mix.BUILDER_VERSION and meta["seed"] == 0
    files = meta["sources"]["sharegpt4o"]["files"]
    assert files[0]["bytes"] == (cache / files[0]["path"]).stat().st_size
    assert len({r["id"] for r in records}) == RECORDS
    for r in records:
        assert set(r) == {"id", "source", "conversations", "images", "upstream"}
        assert r["upstream"]["config"] == SOURCE_CONFIGS[r["source"]]
        assert r["images"] == [f"images/{r['source']}/{r['id']}.{r['images'][0][-3:]}"]
        assert (mix / r["images"][0]).is_file()


def test_counts_follow_the_weights(mix: Path) -> None:
    meta = json.loads((mix / "metadata.json").read_text())
    counts = {s: 0 for s in SOURCE_CONFIGS}
    for r in _records(mix):
        counts[r["source"]] += 1
    assert counts == meta["counts"] == allocate(source_weights(), RECORDS)
    for s, n in counts.items():
        assert abs(n - source_weights()[s] * RECORDS) < 1
    tail = {r["source"] for r in _records(mix)[-20:]}  # shuffled: the holdout tail is mixed
    assert len(tail) >= 3


def test_images_are_the_parquet_bytes(mix: Path, cache: Path) -> None:
    for r in _records(mix)[:40]:
        folder = config_dir(cache, r["source"])
        table = pq.read_table(sorted(folder.glob("*.parquet")), columns=["image"])
        expected = table.column("image")[r["upstream"]["index"]].as_py()["bytes"]
        assert (mix / r["images"][0]).read_bytes() == expected


def test_every_record_loads_through_the_pipeline(mix: Path, small_processor_dir: Path) -> None:
    ds = PreprocessedDataset(DataConfig("mmmix", str(mix), str(small_processor_dir)))
    lengths = ds.lengths()
    assert len(lengths) == RECORDS and (lengths > 0).all()
    first_of = {}
    for i, r in enumerate(ds.records):
        first_of.setdefault(r["source"], i)
    for i in first_of.values():
        sample = ds[i]
        assert len(sample["input_ids"]) == ds.length(i) and "pixel_values" in sample
    stats = summary(np.asarray(lengths), SHORT_THRESHOLD)
    assert 0.6 < stats["cv"] < 1.0 and stats["f_s"] >= 0.35  # bimodal, like the paper's mix


def test_deterministic_for_a_seed(mix: Path, cache: Path, tmp_path: Path) -> None:
    again = build(MMMixConfig(cache, tmp_path / "again", RECORDS, seed=0))
    other = build(MMMixConfig(cache, tmp_path / "other", RECORDS, seed=1))
    text = (mix / "records.jsonl").read_bytes()
    assert (tmp_path / "again" / "records.jsonl").read_bytes() == text
    assert (tmp_path / "other" / "records.jsonl").read_bytes() != text
    assert again["counts"] == other["counts"]
    assert sorted(p.name for p in (tmp_path / "again" / "images").rglob("*")) == sorted(
        p.name for p in (mix / "images").rglob("*"))


def test_missing_source_names_its_config_folder(cache: Path, tmp_path: Path) -> None:
    partial = tmp_path / "cache"
    shutil.copytree(cache, partial)
    shutil.rmtree(config_dir(partial, "aokvqa"))
    with pytest.raises(FileNotFoundError, match=r"aokvqa\(cauldron,llava_format\)"):
        mm_mix.main(["--cache", str(partial), "--out", str(tmp_path / "out"), "--records", "10"])
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_too_few_rows_needs_explicit_repeats(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lower --records to at most 150 or set --max-repeats 2"):
        build(MMMixConfig(cache, tmp_path / "a", 200))
    meta = build(MMMixConfig(cache, tmp_path / "b", 200, max_repeats=2))
    ids = [r["id"] for r in _records(tmp_path / "b")]
    assert meta["counts"]["iiit5k"] == 40 and len(set(ids)) == 200
    repeats = sum(max(0, n - 30) for n in meta["counts"].values())  # 30 rows per config
    assert sum(i.endswith("_r1") for i in ids) == repeats > 0


def test_refuses_to_overwrite_a_build(mix: Path, cache: Path) -> None:
    with pytest.raises(FileExistsError, match="--overwrite"):
        build(MMMixConfig(cache, mix, RECORDS))


def test_paper_config_reads_the_mix_images_from_the_mix_folder() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    from experiments.grid import build_grid

    config = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    mmmix = config["data"]["datasets"]["mmmix"]
    # records hold images/<source>/<id>.<ext>: the image root must be the mix folder
    args = build_grid(config).data_args("mmmix")
    assert args["source"] == mmmix["build"] and "image_dir" not in args
    assert mmmix["image_max_pixels"] == MMMixConfig(root, root, 10).image_max_pixels
