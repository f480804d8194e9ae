"""A tiny causal LM and a token dataset for the integration tests (CPU, seconds).

Shared by the rank scripts (run under torchrun) and the tests that check them: the same
seed builds the same initial weights in both, so the tests can compute the reference
gradient in their own process.
"""

from __future__ import annotations

import torch

VOCAB = 97


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """A 2-layer Qwen3 causal LM of about 30k parameters, seeded."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float()


class TokenDataset:
    """``n`` samples of seeded random tokens, lengths drawn from [lo, hi]; the first
    quarter of each sample is prompt (labels -100)."""

    def __init__(self, n: int, lo: int, hi: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + index)
        ids = torch.randint(1, VOCAB, (self.lengths[index],), generator=g)
        labels = ids.clone()
        labels[: len(ids) // 4] = -100
        return {"input_ids": ids, "labels": labels}


def reference_grads(model: torch.nn.Module, samples: list[dict]) -> dict[str, torch.Tensor]:
    """One process's gradient of the per-token mean loss over ``samples`` (shifted labels)."""
    tokens = sum(int((s["labels"][1:] != -100).sum()) for s in samples)
    model.zero_grad()
    for s in samples:
        batch = {k: v[None] for k, v in s.items()}
        model(**batch, num_items_in_batch=tokens).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def tiny_tokenizer():
    """A word-level tokenizer over the ``VOCAB`` ids, pad 0 and eos 1 (TRL needs one)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1} | {f"t{i}": i for i in range(2, VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eos>",
    )


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
