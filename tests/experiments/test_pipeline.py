"""The preprocessing dataset: calibrated CVs, exact lengths, image tokens, masking,
augmentation, fingerprint, cutoff, and a forward/backward through the tiny Qwen3-VL."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import odb
from experiments.data.assets import IMAGE_PAD, build_tiny_model
from experiments.data.pipeline import IGNORE_INDEX, PreprocessedDataset, collate
from experiments.data.pixels import decode_batch
from experiments.data.proxy_lengths import SHORT_THRESHOLD, image_tokens, summary
from experiments.data.proxy_plans import TARGET_CV
from experiments.data.records import DataConfig, normalise
from tests.experiments.conftest import CV_SAMPLES


@pytest.fixture(scope="module")
def cv_lengths(cv_datasets_by_name: dict) -> dict[str, np.ndarray]:
    """Every record's length in the default-size proxies (a few seconds per proxy)."""
    return {name: ds.lengths() for name, ds in cv_datasets_by_name.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TARGET_CV))
def test_post_pipeline_cv_hits_paper_target(name: str, cv_lengths: dict) -> None:
    lengths = cv_lengths[name]
    assert len(lengths) >= CV_SAMPLES
    assert summary(lengths)["cv"] == pytest.approx(TARGET_CV[name], abs=0.03)


@pytest.mark.slow
def test_mmmix_has_many_short_samples(cv_lengths: dict) -> None:
    stats = summary(cv_lengths["mmmix"], SHORT_THRESHOLD)
    assert stats["f_s"] >= 0.35, stats  # OCR share is 0.40; all OCR samples are short
    assert summary(cv_lengths["llava"])["f_s"] < 0.05


@pytest.mark.parametrize("name", list(TARGET_CV))
def test_cheap_length_equals_full_pipeline(name: str, datasets_by_name: dict) -> None:
    """The shortest, middle and longest of 200 records: the length without pixels is
    the length of the sample built."""
    ds = datasets_by_name[name]
    lengths = np.array([ds.length(i) for i in range(200)])
    order = np.argsort(lengths)
    for i in [*order[:3], *order[len(order) // 2: len(order) // 2 + 2], order[-1]]:
        assert len(ds[int(i)]["input_ids"]) == lengths[i]


def test_image_tokens_match_processor_count(datasets_by_name: dict) -> None:
    ds = datasets_by_name["mmmix"]
    pad = ds.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    for i in range(6):
        sample = ds[i]
        grid = sample["image_grid_thw"]
        n_pad = int((sample["input_ids"] == pad).sum())
        assert n_pad == int(grid.prod(-1).sum()) // ds.merge**2
        assert sample["pixel_values"].shape[0] == int(grid.prod(-1).sum())
        _, refs = normalise("mmmix", ds.records[i])
        sizes = [ds._open(r).size for r in refs]
        assert n_pad == sum(ds.image_processor.get_number_of_image_patches(h, w, {}) // 4
                            for w, h in sizes)
        assert n_pad == sum(image_tokens(h, w, ds.cfg.image_max_pixels) for w, h in sizes)


def test_labels_train_only_assistant_content(datasets_by_name: dict) -> None:
    ds = datasets_by_name["llava"]
    sample = ds[0]
    ids, labels = sample["input_ids"], sample["labels"]
    trained = labels != IGNORE_INDEX
    assert trained.any() and (~trained).any()
    assert torch.equal(labels[trained], ids[trained])
    assert not any(int(t) in ds.vision_ids for t in ids[trained])
    end = ds.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns, _ = normalise("llava", ds.records[0])
    n_assistant = sum(role == "assistant" for role, _ in turns)
    assert int((labels == end).sum()) == n_assistant  # each answer's <|im_end|> is trained


def test_text_rendering_equals_chat_template(datasets_by_name: dict) -> None:
    ds = datasets_by_name["ultrachat"]
    for i in range(5):
        messages = ds.records[i]["messages"]
        ref = ds.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)
        assert ds[i]["input_ids"].tolist() == list(ref["input_ids"])


def _variant(ds: PreprocessedDataset, **changes) -> PreprocessedDataset:
    return PreprocessedDataset(dataclasses.replace(ds.cfg, max_samples=200, **changes))


def test_augmentation_changes_lengths_per_epoch(datasets_by_name: dict) -> None:
    base = _variant(datasets_by_name["mmmix"])
    aug = _variant(datasets_by_name["mmmix"], aug_min_scale=0.5, aug_max_scale=1.5)
    off = base.lengths()
    epoch0 = aug.lengths()
    assert not np.array_equal(off, epoch0)
    aug.set_epoch(1)
    epoch1 = aug.lengths()
    assert not np.array_equal(epoch0, epoch1)
    aug.set_epoch(0)
    assert np.array_equal(aug.lengths(), epoch0)  # seeded by (seed, epoch, index)
    base.set_epoch(1)
    assert np.array_equal(base.lengths(), off)  # no augmentation: epochs agree
    aug.set_epoch(1)
    for i in range(4):
        assert len(aug[i]["input_ids"]) == epoch1[i]


def test_fingerprint_changes_with_every_knob(datasets_by_name: dict, tmp_path: Path) -> None:
    base = _variant(datasets_by_name["mmmix"])
    assert base.fingerprint() == _variant(datasets_by_name["mmmix"]).fingerprint()
    aug = {"aug_min_scale": 0.5, "aug_max_scale": 1.5}
    variants = {
        "cutoff_len": {"cutoff_len": 8192},
        "image_max_pixels": {"image_max_pixels": 512 * 512},
        "image_min_pixels": {"image_min_pixels": 32 * 32 * 16},
        "augmentation": aug,
        "aug_max_scale": {"aug_min_scale": 0.5, "aug_max_scale": 2.0},
        "max_samples": {"max_samples": 100},
        "image_dir": {"image_dir": str(tmp_path)},
        "holdout_samples": {"holdout_samples": 20},
        "holdout": {"holdout_samples": 20, "holdout": True},
        "holdout_seed": {"holdout_samples": 20, "holdout_seed": 42},
    }
    seen = {base.fingerprint()}
    for knob, change in variants.items():
        fp = PreprocessedDataset(dataclasses.replace(base.cfg, **change)).fingerprint()
        assert fp not in seen, knob
        seen.add(fp)
    seeded = PreprocessedDataset(dataclasses.replace(base.cfg, seed=1, **aug))
    assert seeded.fingerprint() not in seen
    # without augmentation the seed changes no length, so the cache stays valid
    assert _variant(datasets_by_name["mmmix"], seed=1).fingerprint() == base.fingerprint()
    other_data = datasets_by_name["sharegpt4o"]
    assert other_data.fingerprint() not in seen


def test_fingerprint_changes_with_tokenizer(datasets_by_name: dict, tmp_path: Path) -> None:
    from experiments.data.assets import build_image_processor, train_tokenizer

    out = tmp_path / "other"
    train_tokenizer(iter(["some other corpus text"] * 50), out, vocab_size=400)
    build_image_processor(768 * 768).save_pretrained(out)
    base = _variant(datasets_by_name["ultrachat"])
    other = PreprocessedDataset(dataclasses.replace(base.cfg, processor=str(out)))
    assert other.fingerprint() != base.fingerprint()


def test_cutoff_truncates_text_and_refuses_to_cut_images(datasets_by_name: dict) -> None:
    text = _variant(datasets_by_name["ultrachat"], cutoff_len=64)
    assert max(text.lengths()) == 64
    assert len(text[0]["labels"]) == 64
    images = _variant(datasets_by_name["llava"], cutoff_len=64)
    with pytest.raises(ValueError, match="raise cutoff_len"):
        images[0]


def test_holdout_split_is_disjoint_and_complete(datasets_by_name: dict) -> None:
    base = _variant(datasets_by_name["ultrachat"])
    train = _variant(datasets_by_name["ultrachat"], holdout_samples=30)
    held = _variant(datasets_by_name["ultrachat"], holdout_samples=30, holdout=True)
    assert (len(train), len(held)) == (170, 30)
    ids = [r["prompt_id"] for r in base.records]
    assert [r["prompt_id"] for r in train.records] + [r["prompt_id"] for r in held.records] == ids
    with pytest.raises(ValueError, match="leaves no training records"):
        _variant(datasets_by_name["ultrachat"], holdout_samples=200)


def test_seeded_holdout_is_a_random_disjoint_complete_split(datasets_by_name: dict) -> None:
    base = _variant(datasets_by_name["ultrachat"])
    ids = [r["prompt_id"] for r in base.records]
    train = _variant(datasets_by_name["ultrachat"], holdout_samples=30, holdout_seed=42)
    held = _variant(datasets_by_name["ultrachat"], holdout_samples=30, holdout_seed=42,
                    holdout=True)
    train_ids = [r["prompt_id"] for r in train.records]
    held_ids = [r["prompt_id"] for r in held.records]
    assert (len(train_ids), len(held_ids)) == (170, 30)
    assert sorted(train_ids + held_ids) == sorted(ids)
    assert held_ids != ids[-30:]  # not the tail
    assert held_ids == sorted(held_ids, key=ids.index)  # record order kept
    again = _variant(datasets_by_name["ultrachat"], holdout_samples=30, holdout_seed=42,
                     holdout=True)
    assert [r["prompt_id"] for r in again.records] == held_ids
    other = _variant(datasets_by_name["ultrachat"], holdout_samples=30, holdout_seed=7,
                     holdout=True)
    assert [r["prompt_id"] for r in other.records] != held_ids


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="holdout_seed must be >= 0"):
        DataConfig("mmmix", "x", "y", holdout_samples=4, holdout_seed=-1)
    with pytest.raises(ValueError, match="holdout_samples=0"):
        DataConfig("mmmix", "x", "y", holdout=True)
    with pytest.raises(ValueError, match="aug_min_scale"):
        DataConfig("mmmix", "x", "y", aug_min_scale=2.0, aug_max_scale=1.0)
    with pytest.raises(ValueError, match="Unknown dataset"):
        DataConfig("coco", "x", "y")
    with pytest.raises(ValueError, match="Unknown pixels"):
        DataConfig("mmmix", "x", "y", pixels="float16")


def test_multimodal_batch_trains_tiny_qwen3vl(datasets_by_name: dict) -> None:
    ds = datasets_by_name["mmmix"]
    lengths = [ds.length(i) for i in range(20)]
    picks = sorted(range(20), key=lengths.__getitem__)[:3]  # short OCR/VQA samples: fast
    batch = collate([ds[i] for i in picks], ds.tokenizer.pad_token_id)
    assert isinstance(batch["pixel_values"], odb.TensorParts)
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(-1).sum())
    assert batch["pixel_values"].dtype == torch.uint8  # DataConfig.pixels default
    moved = {k: v.to("cpu") for k, v in batch.items()}  # as the training loop moves it
    batch = decode_batch(moved, ds.pixel_codec)
    assert batch["pixel_values"].dtype == torch.float32
    model = build_tiny_model(ds.tokenizer, seed=0)
    out = model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0
