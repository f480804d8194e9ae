"""Local tokenizer, processor and tiny Qwen3-VL for the hub-free CPU path.

- `train_tokenizer`: byte-level BPE trained with the `tokenizers` library on the proxy
  corpus, with the Qwen3-VL special tokens and a Qwen3-VL-style chat template, saved with
  ``save_pretrained`` as a ``PreTrainedTokenizerFast``;
- `build_image_processor` / `load_processor`: the Qwen-VL image processor (patch 16,
  merge 2, temporal patch 2, mean/std 0.5; the PIL backend, no torchvision needed) with a
  configurable pixel budget. The same `load_processor` takes a hub id
  (``Qwen/Qwen3-VL-2B-Instruct``) on the cluster or a local folder here;
- `build_tiny_model`: a seeded, config-built ``Qwen3VLForConditionalGeneration`` (the
  configuration verified in reference/VERIFIED.md) whose special-token ids are the local
  tokenizer's.

    python -m experiments.data.assets --proxies data/proxies --out data/assets
"""

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"

# Qwen3-VL-Instruct's template, reduced to what the datasets use: an optional system turn,
# string or typed-list content, images rendered in place as vision_start/image_pad/vision_end.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def corpus_from_proxies(root: Path, records_per_file: int = 500) -> Iterator[str]:
    """Text fields of the first ``records_per_file`` records of every proxy file below
    ``root``, plus the template strings (the proxies share one vocabulary, so a few
    hundred records per file already cover it; training stays a few seconds)."""
    yield "<|im_start|>system\n<|im_start|>user\n<|im_start|>assistant\n<|im_end|>\n"
    for path in sorted(root.rglob("*.json*")):
        if path.name in ("metadata.json", "proxy_meta.json"):
            continue
        text = path.read_text()
        rows = json.loads(text) if path.suffix == ".json" else map(json.loads, text.splitlines())
        for _, row in zip(range(records_per_file), rows, strict=False):
            for turn in row.get("messages", []):
                yield turn["content"]
            for turn in row.get("conversations", []):
                yield turn["value"].replace("<image>", "")


def train_tokenizer(texts: Iterator[str], out_dir: Path, vocab_size: int = 8192):
    """Train a byte-level BPE on ``texts`` and save it (with the chat template) to ``out_dir``.

    Returns the ``PreTrainedTokenizerFast``.

    Example:
        >>> tok = train_tokenizer(iter(["hi"] * 10), Path(tmp), 300)  # doctest: +SKIP
        >>> tok.convert_tokens_to_ids("<|im_start|>")  # doctest: +SKIP
        1
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def build_image_processor(max_pixels: int, min_pixels: int = 64 * 32 * 32):
    """The Qwen3-VL image processor settings (patch 16, merge 2) with a pixel budget."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2,
        size={"longest_edge": max_pixels, "shortest_edge": min_pixels},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )


def load_processor(name_or_path: str, max_pixels: int, min_pixels: int = 64 * 32 * 32):
    """(tokenizer, image processor) from a local folder or a hub id, with the given budget.

    The budget is set through ``size`` (longest_edge = max pixels, shortest_edge = min
    pixels): in transformers 5 that is the knob the resize honours.
    """
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(name_or_path)
    image_processor.size = {"longest_edge": max_pixels, "shortest_edge": min_pixels}
    return tokenizer, image_processor


def build_tiny_model(tokenizer, seed: int = 0, out_dir: Path | None = None):
    """A random-init ~1M-parameter Qwen3-VL whose special ids match ``tokenizer``."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VISION_START, VISION_END)}
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=32768,
            rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                          "mrope_interleaved": True},
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                           temporal_patch_size=2, deepstack_visual_indexes=[0]),
        image_token_id=ids[IMAGE_PAD], vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    if out_dir is not None:
        model.save_pretrained(out_dir)
    return model


def build_assets(proxies: Path, out: Path, max_pixels: int, seed: int = 0) -> dict:
    """Tokenizer + image processor in ``out/processor``, tiny model in ``out/model``."""
    tokenizer = train_tokenizer(corpus_from_proxies(proxies), out / "processor")
    build_image_processor(max_pixels).save_pretrained(out / "processor")
    tokenizer.save_pretrained(out / "model")
    build_tiny_model(tokenizer, seed, out / "model")
    return {"processor": str(out / "processor"), "model": str(out / "model"),
            "vocab_size": len(tokenizer)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-pixels", type=int, default=768 * 768)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    record = build_assets(args.proxies, args.out, args.max_pixels, args.seed)
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
