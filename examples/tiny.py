"""The tiny model, data and tokenizer of the examples: CPU-sized, built in place, no download.

A 2-layer Qwen3 causal LM from a config (random weights, seeded) and random token
sequences of 16-200 tokens whose first quarter is prompt (labels -100), so batches
really vary in length and in loss tokens. The sizes are parameters: the integration
tests build a smaller one from the same functions (``tests/odb/integrations/tiny.py``).
"""

import torch


class RandomTokens(torch.utils.data.Dataset):
    """``n`` seeded samples of ``lo``-``hi`` tokens over ids ``1..vocab-1``; the first
    quarter of each is prompt (labels -100). Sample ``i`` is the same for every ``n``."""

    def __init__(self, n: int, vocab: int = 256, lo: int = 16, hi: int = 200, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(lo, hi + 1, (n,), generator=generator).tolist()
        self.vocab = vocab
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        ids = torch.randint(1, self.vocab, (self.lengths[i],), generator=g)
        labels = ids.clone()
        labels[: len(ids) // 4] = -100
        return {"input_ids": ids, "labels": labels}


def tiny_model(vocab_size: int = 256, hidden_size: int = 64, seed: int = 0) -> torch.nn.Module:
    """A 2-layer Qwen3 causal LM (~0.2M parameters at the defaults), fp32, the same
    weights on every rank for one ``seed``; 4 heads of ``hidden_size // 4``, 2 KV heads."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float()


def tiny_tokenizer(vocab_size: int = 256):
    """A word-level tokenizer over the tiny model's ids: pad 0, eos 1 (no download)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1} | {f"t{i}": i for i in range(2, vocab_size)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eos>",
    )
