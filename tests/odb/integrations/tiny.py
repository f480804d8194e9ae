"""A tiny causal LM and a token dataset for the integration tests (CPU, seconds).

The examples' own (``examples/tiny.py``, their one home) at a smaller size. Shared by
the rank scripts (run under torchrun) and the tests that check them: the same seed
builds the same initial weights in both, so the tests can compute the reference
gradient in their own process.
"""

from __future__ import annotations

import torch

import examples.tiny

VOCAB = 97


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """The examples' tiny Qwen3 at about 30k parameters, seeded."""
    return examples.tiny.tiny_model(vocab_size=VOCAB, hidden_size=32, seed=seed)


class TokenDataset(examples.tiny.RandomTokens):
    """``n`` samples of seeded random tokens over ``VOCAB``, lengths drawn from [lo, hi];
    the first quarter of each sample is prompt (labels -100)."""

    def __init__(self, n: int, lo: int, hi: int, seed: int = 0) -> None:
        super().__init__(n, vocab=VOCAB, lo=lo, hi=hi, seed=seed)


def reference_grads(model: torch.nn.Module, samples: list[dict]) -> dict[str, torch.Tensor]:
    """One process's gradient of the per-token mean loss over ``samples`` (shifted labels)."""
    tokens = sum(int((s["labels"][1:] != -100).sum()) for s in samples)
    model.zero_grad()
    for s in samples:
        batch = {k: v[None] for k, v in s.items()}
        model(**batch, num_items_in_batch=tokens).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def tiny_tokenizer():
    """The examples' word-level tokenizer over the ``VOCAB`` ids (TRL needs one)."""
    return examples.tiny.tiny_tokenizer(VOCAB)


def completion_dataset(dataset: TokenDataset):
    """``dataset`` as TRL's tokenised prompt-completion form: a ``datasets.Dataset`` of
    ``input_ids`` and ``completion_mask`` (0 on the prompt quarter), no ``labels``."""
    import datasets

    rows = [dataset[i] for i in range(len(dataset))]
    return datasets.Dataset.from_dict(
        {
            "input_ids": [r["input_ids"].tolist() for r in rows],
            "completion_mask": [(r["labels"] != -100).int().tolist() for r in rows],
        }
    )
