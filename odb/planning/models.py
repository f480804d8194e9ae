"""Architectures for the step-cost model: the published Qwen3-VL configs, or any HF
``config.json`` by path; every number with its source.

Only the shapes that decide a training step's FLOPs and bytes are kept: the text
decoder's layers, widths, heads and vocabulary, and the vision tower's depth, width and
patch geometry (depth 0 for a text-only model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_QWEN2B = "huggingface.co/Qwen/Qwen3-VL-2B-Instruct/blob/main/config.json"
_QWEN8B = "huggingface.co/Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json"
_LLAMA = (
    "huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (= torchtitan "
    "torchtitan/models/llama3 '8B' args)"
)

_PROXY = (
    "bench/gpu_train_throughput.py at commit 7a9538f: the Qwen3Config of the GPU-proxy "
    "runs (docs/benchmarks.md, 'GPU proxy'; 166M parameters)"
)


@dataclass(frozen=True)
class Architecture:
    """A decoder (and optional vision tower) as the cost model sees it.

    ``patch_merge`` is how many vision patches make one text token (Qwen-VL: the 2x2
    spatial merge, 4); a sample's vision patches are its image tokens times it.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    patch_merge: int
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, key) < 1:
                raise ValueError(f"{self.name}: {key} must be >= 1, got {getattr(self, key)}")

    @property
    def layer_linear_params(self) -> int:
        """Weights of one decoder layer's matmuls (q, k, v, o and the gated MLP)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate

    @property
    def text_linear_params(self) -> int:
        """Every matmul weight a token passes through (the layers and the LM head)."""
        return self.layers * self.layer_linear_params + self.vocab * self.hidden

    @property
    def text_params(self) -> int:
        """The decoder's parameters (embeddings once when tied)."""
        embed = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.text_linear_params + embed

    @property
    def vision_linear_params(self) -> int:
        """One vision block's matmuls (qkv, proj, 2-layer MLP) times the depth."""
        h = self.vision_hidden
        return self.vision_depth * (4 * h * h + 2 * h * self.vision_intermediate)

    @property
    def params(self) -> int:
        return self.text_params + self.vision_linear_params

    def lora_params(self, rank: int) -> int:
        """LoRA adapters of rank ``rank`` on every decoder matmul (LLaMA-Factory's
        ``lora_target: all``): ``rank x (in + out)`` per matrix."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = [(self.hidden, q_out), (self.hidden, kv_out), (self.hidden, kv_out),
                  (q_out, self.hidden)] + [(self.hidden, self.intermediate)] * 2 + [
                  (self.intermediate, self.hidden)]  # fmt: skip
        return self.layers * rank * sum(i + o for i, o in shapes)


def _qwen(
    name: str, source: str, text: dict[str, int], vision: dict[str, int], tied: bool
) -> Architecture:
    return Architecture(
        name=name,
        **text,
        tied_embeddings=tied,
        **vision,
        patch_merge=4,
        sources={
            "all": source + " (text_config, vision_config); mirrored in "
            "experiments/train/model.py ARCHITECTURES",
            "patch_merge": source + ": spatial_merge_size 2 (2x2)",
        },
    )


MODELS: dict[str, Architecture] = {
    "qwen3-vl-2b": _qwen(
        "qwen3-vl-2b",
        _QWEN2B,
        dict(
            layers=28,
            hidden=2048,
            intermediate=6144,
            heads=16,
            kv_heads=8,
            head_dim=128,
            vocab=151936,
        ),
        dict(vision_depth=24, vision_hidden=1024, vision_intermediate=4096, vision_heads=16),
        tied=True,
    ),
    "qwen3-vl-8b": _qwen(
        "qwen3-vl-8b",
        _QWEN8B,
        dict(
            layers=36,
            hidden=4096,
            intermediate=12288,
            heads=32,
            kv_heads=8,
            head_dim=128,
            vocab=151936,
        ),
        dict(vision_depth=27, vision_hidden=1152, vision_intermediate=4304, vision_heads=16),
        tied=False,
    ),
    "llama-3.1-8b": Architecture(
        "llama-3.1-8b",
        32,
        4096,
        14336,
        32,
        8,
        128,
        128256,
        False,
        0,
        0,
        0,
        0,
        1,
        {"all": _LLAMA, "patch_merge": "text only"},
    ),
    "gpu-proxy-166m": Architecture(
        "gpu-proxy-166m",
        8,
        1024,
        3072,
        16,
        8,
        64,
        32000,
        False,
        0,
        0,
        0,
        0,
        1,
        {"all": _PROXY, "patch_merge": "text only"},
    ),
}
ALIASES = {"2b": "qwen3-vl-2b", "8b": "qwen3-vl-8b"}


def architecture(name_or_path: str | Path) -> Architecture:
    """A table model by name (``qwen3-vl-2b``, ``qwen3-vl-8b``, ``llama-3.1-8b``, ``2b``,
    ``8b``) or an HF ``config.json`` (a file, or a directory holding one)."""
    key = str(name_or_path).lower()
    key = ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model {name_or_path!r}: give one of {sorted(MODELS)} "
            "or the path of an HF config.json"
        )
    return from_hf_config(json.loads(path.read_text()), str(path))


def from_hf_config(config: Mapping[str, Any], source: str) -> Architecture:
    """An :class:`Architecture` from an HF config dict (a VLM's ``text_config`` and
    ``vision_config``, or a plain decoder's top level)."""
    text = config.get("text_config") or config
    vision = config.get("vision_config") or {}
    try:
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        arch = Architecture(
            name=str(config.get("_name_or_path") or source), layers=int(text["num_hidden_layers"]),
            hidden=hidden, intermediate=int(text["intermediate_size"]), heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads), vocab=int(text["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings",
                                            text.get("tie_word_embeddings", False))),
            vision_depth=int(vision.get("depth", 0)),
            vision_hidden=int(vision.get("hidden_size", 0)),
            vision_intermediate=int(vision.get("intermediate_size", 0)),
            vision_heads=int(vision.get("num_heads", 0)),
            patch_merge=int(vision.get("spatial_merge_size", 1)) ** 2,
            sources={"all": source, "patch_merge": source})  # fmt: skip
    except KeyError as error:
        raise ValueError(
            f"{source}: the config lacks {error}; give an HF decoder config "
            "(num_hidden_layers, hidden_size, intermediate_size, ...)"
        ) from None
    return arch
