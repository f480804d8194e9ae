"""Small fixtures in the hubs' own formats (parquet with embedded images, LLaVA's JSON
array with a trailing <image>) load through `datasets` and the same pipeline; plus the
length-statistics command."""

import json
from pathlib import Path

import datasets
import pytest
from PIL import Image

from experiments.data import length_stats
from experiments.data.pipeline import PreprocessedDataset
from experiments.data.records import DataConfig, normalise

CONV = [{"from": "human", "value": "describe this\n<image>"}, {"from": "gpt", "value": "a cat"}]


def test_ultrachat_parquet(tmp_path: Path, small_processor_dir: Path) -> None:
    rows = {"prompt": ["hi"], "prompt_id": ["0" * 64],
            "messages": [[{"content": "hi", "role": "user"},
                          {"content": "hello there", "role": "assistant"}]]}
    datasets.Dataset.from_dict(rows).to_parquet(tmp_path / "train_sft-00000.parquet")
    ds = PreprocessedDataset(DataConfig("ultrachat", str(tmp_path), str(small_processor_dir)))
    assert len(ds) == 1 and ds.length(0) == len(ds[0]["input_ids"])


def test_sharegpt4o_parquet_with_embedded_image(tmp_path: Path, small_processor_dir: Path) -> None:
    image = tmp_path / "x.png"
    Image.new("RGB", (500, 375), (1, 2, 3)).save(image)
    rows = {"id": ["s0"], "image": [str(image)], "conversations": [CONV],
            "data_source": ["sharegpt4o"]}
    table = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    table.to_parquet(tmp_path / "data" / "sharegpt4o-00000.parquet")
    ds = PreprocessedDataset(DataConfig("sharegpt4o", str(tmp_path / "data"),
                                        str(small_processor_dir)))
    sample = ds[0]
    assert sample["image_grid_thw"].tolist() == [[1, 24, 32]]  # 375x500 -> 384x512
    assert ds.length(0) == len(sample["input_ids"])


def test_llava_json_array_moves_image_tag_first(tmp_path: Path, small_processor_dir: Path) -> None:
    (tmp_path / "train2017").mkdir()
    Image.new("RGB", (640, 480)).save(tmp_path / "train2017" / "000000000001.jpg")
    path = tmp_path / "llava_instruct_150k.json"
    path.write_text(json.dumps([{"id": "000000000001", "image": "000000000001.jpg",
                                 "conversations": CONV}]))
    ds = PreprocessedDataset(DataConfig("llava", str(path), str(small_processor_dir)))
    turns, images = normalise("llava", ds.records[0])
    assert turns[0][1] == "<image>\ndescribe this" and images == ["000000000001.jpg"]
    assert ds.length(0) == len(ds[0]["input_ids"])


def test_placeholder_image_mismatch_is_an_error() -> None:
    row = {"id": "r", "conversations": CONV, "images": []}
    with pytest.raises(ValueError, match="1 <image> placeholders but 0 images"):
        normalise("mmmix", row)


def test_length_stats_command(
    small_proxy_root: Path, small_processor_dir: Path, tmp_path: Path
) -> None:
    record = length_stats.main([
        "--dataset", "mmmix", "--source", str(small_proxy_root / "mmmix"),
        "--processor", str(small_processor_dir), "--max-samples", "300",
        "--hist", str(tmp_path / "h.png"), "--out", str(tmp_path / "s.json")])
    assert {"mean", "p50", "p95", "p99", "cv", "f_s", "short_threshold"} <= set(record)
    assert (tmp_path / "h.png").stat().st_size > 0
    assert json.loads((tmp_path / "s.json").read_text())["cv"] == record["cv"]
