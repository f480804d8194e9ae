"""Build the Qwen3-VL a run trains: pretrained or random weights, full or LoRA, frozen parts.

Three ways to get the model, one class (``Qwen3VLForConditionalGeneration``):

- ``pretrained``: ``from_pretrained(path)``: the hub checkpoints on the cluster, the tiny
  CPU model (``results/data/assets/model``) here, or any checkpoint a run saved;
- ``random``: the real 2B / 8B architecture (or the CPU benchmark size) from its config
  with seeded random weights, so throughput can be measured without hub access.

Special-token ids are the tokenizer's (a random model must agree with the tokenizer that
made the data). Trainability: in full mode the language model trains and the vision
tower and merger train only with ``train_vision``; in LoRA mode only the adapters train.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from experiments.data.assets import IMAGE_PAD, VISION_END, VISION_START
from experiments.train.config import LoraConfig, ModelConfig

__all__ = ["ARCHITECTURES", "apply_lora", "build_model", "parameter_counts", "set_trainable"]

log = logging.getLogger(__name__)

# The published Qwen3-VL-Instruct configs (text and vision towers), and a CPU-sized one
# whose step cost is dominated by per-token matmuls rather than Python overhead.
_ROPE = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
_VISION = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
               hidden_act="gelu_pytorch_tanh", num_position_embeddings=2304)
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3-vl-2b": {
        "text": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, rope_theta=5_000_000, max_position_embeddings=262144,
                     rope_scaling=_ROPE, tie_word_embeddings=True),
        "vision": dict(_VISION, depth=24, hidden_size=1024, intermediate_size=4096,
                       num_heads=16, out_hidden_size=2048, deepstack_visual_indexes=[5, 11, 17]),
        "tie_word_embeddings": True,
    },
    "qwen3-vl-8b": {
        "text": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rope_theta=5_000_000, max_position_embeddings=262144,
                     rope_scaling=_ROPE, tie_word_embeddings=False),
        "vision": dict(_VISION, depth=27, hidden_size=1152, intermediate_size=4304,
                       num_heads=16, out_hidden_size=4096, deepstack_visual_indexes=[8, 16, 24]),
        "tie_word_embeddings": False,
    },
    "cpu-bench": {
        "text": dict(vocab_size=0, hidden_size=256, intermediate_size=768,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, rope_theta=1_000_000, max_position_embeddings=32768,
                     rope_scaling={"rope_type": "default", "mrope_section": [8, 12, 12],
                                   "mrope_interleaved": True}, tie_word_embeddings=True),
        "vision": dict(_VISION, depth=2, hidden_size=128, intermediate_size=256, num_heads=2,
                       out_hidden_size=256, deepstack_visual_indexes=[0]),
        "tie_word_embeddings": True,
    },
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _special_ids(tokenizer) -> dict[str, int]:
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", IMAGE_PAD), ("vision_start_token_id", VISION_START),
        ("vision_end_token_id", VISION_END), ("video_token_id", "<|video_pad|>"))}
    missing = [n for n, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"the tokenizer lacks Qwen3-VL special tokens for {missing}; use "
                         "a Qwen3-VL tokenizer (or the local one from experiments.data.assets)")
    return ids


def _random_model(cfg: ModelConfig, tokenizer, seed: int):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    arch = ARCHITECTURES[cfg.architecture]
    text = dict(arch["text"], pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id)
    text["vocab_size"] = max(text["vocab_size"], len(tokenizer))
    config = Qwen3VLConfig(text_config=text, vision_config=dict(arch["vision"]),
                           tie_word_embeddings=arch["tie_word_embeddings"],
                           **_special_ids(tokenizer))
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return Qwen3VLForConditionalGeneration(config)


def build_model(cfg: ModelConfig, tokenizer, seed: int, device: torch.device):
    """The model of ``cfg`` on ``device`` in its dtype, in train mode.

    Raises:
        ValueError: a pretrained model whose special-token ids differ from the tokenizer's.
    """
    from transformers import Qwen3VLForConditionalGeneration

    dtype = _DTYPES[cfg.dtype]
    if cfg.init == "pretrained":
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            cfg.path, dtype=dtype, attn_implementation=cfg.attn_implementation)
        expected = _special_ids(tokenizer)["image_token_id"]
        if model.config.image_token_id != expected:
            raise ValueError(f"model {cfg.path} has image_token_id={model.config.image_token_id}"
                             f" but the tokenizer's <|image_pad|> is {expected}; train with the"
                             " processor the model was made with (data.processor)")
    else:
        model = _random_model(cfg, tokenizer, seed)
        model.config._attn_implementation = cfg.attn_implementation
        model = model.to(dtype)
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).train()


def _vision_parts(model) -> list[torch.nn.Module]:
    return [model.model.visual]  # the vision tower, its merger and deepstack mergers


def set_trainable(model, train_vision: bool) -> None:
    """Full fine-tuning: everything trains except the vision tower unless ``train_vision``."""
    for param in model.parameters():
        param.requires_grad_(True)
    if not train_vision:
        for part in _vision_parts(model):
            part.requires_grad_(False)


def apply_lora(model, cfg: LoraConfig, train_vision: bool):
    """Wrap ``model`` with LoRA adapters; only the adapters train.

    Adapters go on the language model's ``cfg.target_modules`` and, with
    ``train_vision``, on the vision tower's ``cfg.vision_target_modules``.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    text = "|".join(cfg.target_modules)
    pattern = rf".*language_model.*\.({text})"
    if train_vision:
        pattern = rf"({pattern}|.*visual.*\.({'|'.join(cfg.vision_target_modules)}))"
    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=pattern, task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, peft_cfg)
    if not any(p.requires_grad for p in wrapped.parameters()):
        raise ValueError(f"lora.target_modules={list(cfg.target_modules)} matched no linear "
                         "layer of the model; use names such as q_proj, v_proj")
    return wrapped


def parameter_counts(model) -> dict[str, int]:
    """Total and trainable parameters."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}
