"""Validation loss: batching-invariant, equal to a per-sample reference, same on 1 and 2 ranks."""

import math

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from experiments.data.pixels import decode_batch
from experiments.train.validation import plan_batches, validation_loss
from harness.ranks import run_ranks


def test_plan_batches_respects_budget_and_covers_every_index() -> None:
    lengths = [5, 3, 9, 3, 12, 1]
    groups = plan_batches(lengths, token_budget=10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 10
    assert groups == [[5, 1, 3], [0], [2], [4]]
    with pytest.raises(ValueError, match="token_budget must be a positive int, got 0"):
        plan_batches(lengths, 0)


def _reference_loss(model, dataset) -> tuple[float, int]:
    """Sample by sample, no padding, explicit shift: the definition of the number."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(dataset)):
            s = decode_batch(dataset[i], dataset.pixel_codec)  # uint8 pixels -> floats
            inputs = {k: v[None] if v.dim() == 1 else v for k, v in s.items() if k != "labels"}
            logits = model(**inputs).logits[0, :-1].double()
            labels = s["labels"][1:]
            keep = labels != -100
            lp = torch.log_softmax(logits[keep], -1).gather(-1, labels[keep][:, None])
            total -= float(lp.sum())
            count += int(keep.sum())
    return total / count, count


def test_loss_is_the_same_for_every_batching(model_dir, heldout) -> None:
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir).eval()
    lengths = [heldout.length(i) for i in range(len(heldout))]
    pad = heldout.tokenizer.pad_token_id
    budgets = [1, 2 * max(lengths), sum(lengths) * 10]  # singletons, pairs, everything at once
    results = [
        validation_loss(model, heldout, token_budget=b, pad_token_id=pad, progress=False)
        for b in budgets
    ]
    assert [r["batches"] for r in results][0] == len(heldout)
    assert results[-1]["batches"] == 1
    assert len({r["batches"] for r in results}) == 3  # three genuinely different batchings
    ref_loss, ref_tokens = _reference_loss(model, heldout)
    for r in results:
        assert r["samples"] == len(heldout) and r["tokens"] == ref_tokens
        assert r["loss"] == pytest.approx(ref_loss, abs=1e-6)
    assert math.log(len(heldout.tokenizer)) == pytest.approx(ref_loss, rel=0.2)  # random init
    assert not model.training


def _two_ranks(rank: int, world: int, model_dir, proxy_dir) -> dict:
    from experiments.data.pipeline import PreprocessedDataset
    from experiments.train.validation import validation_loss
    from tests.eval.conftest import heldout_config

    torch.set_num_threads(1)
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir)
    ds = PreprocessedDataset(heldout_config(proxy_dir, model_dir))
    return validation_loss(
        model, ds, token_budget=4096, pad_token_id=ds.tokenizer.pad_token_id, progress=False
    )


@pytest.mark.dist
def test_two_ranks_agree_with_one(model_dir, proxy_dir, heldout) -> None:
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir)
    single = validation_loss(
        model,
        heldout,
        token_budget=4096,
        pad_token_id=heldout.tokenizer.pad_token_id,
        progress=False,
    )
    ranks = run_ranks(_two_ranks, 2, model_dir, proxy_dir, timeout=120)
    assert ranks[0] == ranks[1]
    assert ranks[0]["world_size"] == 2
    assert ranks[0]["samples"] == single["samples"] and ranks[0]["tokens"] == single["tokens"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], abs=1e-6)
