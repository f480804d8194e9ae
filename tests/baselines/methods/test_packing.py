"""Packing: restarted positions, masked boundaries, and packed loss == unpacked loss on the
tiny Qwen3-VL text path (transformers 5.24, CPU, ``sdpa`` as the train path uses and
``eager``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import odb
from baselines import PackCollate, block_causal_mask, build_loader
from baselines.length_cache import build

IGNORE = -100


def test_block_causal_mask_isolates_samples() -> None:
    mask = block_causal_mask([3, 2])[0, 0]
    allowed = mask == 0
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[:3, :3] = torch.ones(3, 3, dtype=torch.bool).tril()
    expected[3:, 3:] = torch.ones(2, 2, dtype=torch.bool).tril()
    assert torch.equal(allowed, expected)
    assert torch.isinf(mask[~allowed]).all()


def test_pack_collate_restarts_positions_and_masks_first_labels() -> None:
    samples = [
        {
            "input_ids": torch.arange(1, 5),
            "labels": torch.arange(1, 5),
            "attention_mask": torch.ones(4, dtype=torch.long),
            "mm_token_type_ids": torch.zeros(4),
        },
        {
            "input_ids": torch.arange(5, 8),
            "labels": torch.tensor([IGNORE, 6, 7]),
            "attention_mask": torch.ones(3, dtype=torch.long),
            "mm_token_type_ids": torch.zeros(3),
        },
    ]
    row = PackCollate()(samples)
    assert row["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert row["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert row["labels"].tolist() == [[IGNORE, 2, 3, 4, IGNORE, 6, 7]]
    assert row["attention_mask"].shape == (1, 1, 7, 7)
    assert row["mm_token_type_ids"].shape == (1, 7)
    assert "attention_mask" not in PackCollate(block_mask=False)(samples)


def test_pack_collate_refuses_images_and_odd_fields() -> None:
    text = {"input_ids": torch.arange(3), "labels": torch.arange(3)}
    with pytest.raises(ValueError, match="text-only"):
        PackCollate()([text, dict(text, pixel_values=torch.zeros(4, 8))])
    with pytest.raises(ValueError, match="1-D per-token"):
        PackCollate()([dict(text, extra=torch.zeros(2))])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    """A small UltraChat proxy through the real pipeline, and the tiny Qwen3-VL."""
    from experiments.data.assets import (
        build_image_processor,
        build_tiny_model,
        corpus_from_proxies,
        train_tokenizer,
    )
    from experiments.data.pipeline import PreprocessedDataset
    from experiments.data.proxies import write_proxy
    from experiments.data.proxy_plans import ProxyConfig
    from experiments.data.records import DataConfig

    root: Path = tmp_path_factory.mktemp("packing")
    # 24 samples cannot reach UltraChat's CV of 0.48; the spread only needs to be wide.
    write_proxy(ProxyConfig("ultrachat", num_samples=24, seed=0, target_cv=0.8), root / "uc")
    train_tokenizer(corpus_from_proxies(root), root / "processor", vocab_size=600)
    build_image_processor(768 * 768).save_pretrained(root / "processor")
    dataset = PreprocessedDataset(
        DataConfig("ultrachat", str(root / "uc"), str(root / "processor"), cutoff_len=2048)
    )
    model = build_tiny_model(dataset.tokenizer, seed=0).eval()
    return dataset, model


def _unpacked(model, samples) -> tuple[float, int, list[torch.Tensor]]:
    """Summed token loss, loss tokens and logits of each sample run on its own."""
    total, tokens, logits = 0.0, 0, []
    for s in samples:
        out = model(**{k: v[None] for k, v in s.items()})
        n = int((s["labels"][1:] != IGNORE).sum())
        total, tokens = total + out.loss.double().item() * n, tokens + n
        logits.append(out.logits[0])
    return total, tokens, logits


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_equals_unpacked_on_tiny_qwen3vl(pipeline, attn: str) -> None:
    dataset, model = pipeline
    model.set_attn_implementation(attn)
    lengths = [dataset.length(i) for i in range(len(dataset))]
    picks = sorted(range(len(dataset)), key=lengths.__getitem__)[:3]
    samples = [dataset[i] for i in picks]
    row = PackCollate()(samples)
    with torch.no_grad():
        packed = model(**row)
        total, tokens, logits = _unpacked(model, samples)
        # Not vacuous: restarted positions alone leak attention across samples here.
        leaky = model(**PackCollate(block_mask=False)(samples)).loss.item()
    assert abs(leaky - total / tokens) > 1e-4
    # HF's loss is the mean over the row's loss tokens: the token-weighted mean of the
    # per-sample losses (their plain mean when samples have equal loss-token counts).
    assert int((row["labels"][0, 1:] != IGNORE).sum()) == tokens
    assert packed.loss.item() == pytest.approx(total / tokens, abs=1e-5)
    offsets = torch.tensor([0] + [len(s["input_ids"]) for s in samples]).cumsum(0)
    for k, unpacked in enumerate(logits):
        part = packed.logits[0, offsets[k] : offsets[k + 1]]
        assert (part - unpacked).abs().max().item() < 1e-4


def test_packing_loader_rows_train_like_the_unpacked_samples(pipeline) -> None:
    dataset, model = pipeline
    model.set_attn_implementation("sdpa")
    cache = build(dataset)
    loader = build_loader("packing", dataset, 4096, lengths=cache, shuffle=False)
    rows = [(b, odb.pop_step_info(b)) for b in loader]
    assert all(b["input_ids"].shape[1] <= 4096 for b, _ in rows)
    batch, info = max(rows, key=lambda r: len(r[1].sample_ids))
    assert len(info.sample_ids) >= 3
    positions = torch.cat([torch.arange(cache.lengths[i]) for i in info.sample_ids])
    assert torch.equal(batch["position_ids"][0], positions)
    with torch.no_grad():
        out = model(**batch, num_items_in_batch=info.loss_normalizer)  # summed / tokens
        total, tokens, _ = _unpacked(model, [dataset[i] for i in info.sample_ids])
    assert info.global_loss_tokens == tokens == info.loss_normalizer  # W = 1
    assert out.loss.item() == pytest.approx(total / tokens, abs=1e-5)
