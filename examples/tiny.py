"""The tiny model, data and tokenizer of the examples: CPU-sized, built in place, no download.

A 2-layer Qwen3 causal LM from a config (random weights, seeded) and random token
sequences of 16-200 tokens whose first quarter is prompt (labels -100), so batches
really vary in length and in loss tokens.
"""

import torch


class RandomTokens(torch.utils.data.Dataset):
    """``n`` seeded samples of 16-200 tokens; the first quarter is prompt (no loss)."""

    def __init__(self, n: int, vocab: int = 256) -> None:
        self.lengths = torch.randint(16, 201, (n,), generator=torch.Generator().manual_seed(0))
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(1, self.vocab, (int(self.lengths[i]),), generator=g)
        labels = ids.clone()
        labels[: len(ids) // 4] = -100
        return {"input_ids": ids, "labels": labels}


def tiny_model() -> torch.nn.Module:
    """A ~0.2M-parameter Qwen3 causal LM, the same weights on every rank (seed 0)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            pad_token_id=0,
        )
    )


def tiny_tokenizer():
    """A word-level tokenizer over the tiny model's 256 ids: pad 0, eos 1 (no download)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1} | {f"t{i}": i for i in range(2, 256)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eos>",
    )
