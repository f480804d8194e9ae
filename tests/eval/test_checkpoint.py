"""The checkpoint loader: every layout the train entry point writes, and clear errors."""

import json

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from eval.checkpoint import load_checkpoint


def test_full_checkpoint_and_its_model_folder(full_checkpoint) -> None:
    model, tok, ip, meta = load_checkpoint(full_checkpoint)
    assert isinstance(model, Qwen3VLForConditionalGeneration) and not model.training
    assert (meta.kind, meta.run_id, meta.global_step) == ("full", "tiny-full-s0", 10)
    assert tok.pad_token == "<|endoftext|>" and ip.merge_size == 2
    direct = load_checkpoint(full_checkpoint / "model")[3]
    assert (direct.kind, direct.run_id) == ("full", "tiny-full-s0")


def test_lora_checkpoint_is_merged_and_equals_the_peft_wrapper(lora_checkpoint, model_dir):
    merged, _, _, meta = load_checkpoint(lora_checkpoint)
    wrapped = load_checkpoint(lora_checkpoint, merge_lora=False)[0]
    base = Qwen3VLForConditionalGeneration.from_pretrained(model_dir).eval()
    assert (meta.kind, meta.run_id, meta.base_model) == ("lora", "tiny-lora-s0", str(model_dir))
    assert isinstance(merged, Qwen3VLForConditionalGeneration)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (merged, wrapped, base))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (a - c).abs().max() > 1e-3  # the adapter changes the model


def test_plain_model_folder_has_no_run_id(model_dir) -> None:
    meta = load_checkpoint(model_dir)[3]
    assert (meta.kind, meta.run_id, meta.global_step) == ("full", None, None)


def test_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="none of model/, adapter/"):
        load_checkpoint(tmp_path / "empty")
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    with pytest.raises(ValueError, match="holds a 'gpt2' model"):
        load_checkpoint(other)
