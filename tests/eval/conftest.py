"""Shared fixtures: a small MM-Mix proxy, a local tokenizer/processor and a tiny Qwen3-VL,
built once per session (a few seconds), plus a held-out split of that proxy."""

import json
import shutil
from pathlib import Path

import pytest
import torch

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

PROXY_SAMPLES = 24
HOLDOUT_SAMPLES = 6
MAX_PIXELS = 256 * 256  # small images keep the tiny model's forwards short


@pytest.fixture(scope="session")
def eval_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval")


@pytest.fixture(scope="session")
def proxy_dir(eval_root: Path) -> Path:
    out = eval_root / "proxies" / "mmmix"
    write_proxy(ProxyConfig("mmmix", num_samples=PROXY_SAMPLES, seed=0), out)
    return out


@pytest.fixture(scope="session")
def model_dir(proxy_dir: Path, eval_root: Path) -> Path:
    """A plain HF model folder: tiny Qwen3-VL + tokenizer + image processor."""
    out = eval_root / "tiny_model"
    tokenizer = train_tokenizer(corpus_from_proxies(proxy_dir.parent), out, vocab_size=1000)
    build_image_processor(MAX_PIXELS).save_pretrained(out)
    build_tiny_model(tokenizer, seed=0, out_dir=out)
    return out


def heldout_config(proxy_dir: Path, processor: Path) -> DataConfig:
    return DataConfig(
        "mmmix",
        str(proxy_dir),
        str(processor),
        image_max_pixels=MAX_PIXELS,
        holdout_samples=HOLDOUT_SAMPLES,
        holdout=True,
    )


@pytest.fixture(scope="session")
def heldout(proxy_dir: Path, model_dir: Path) -> PreprocessedDataset:
    return PreprocessedDataset(heldout_config(proxy_dir, model_dir))


def _trainer_state(folder: Path, run_id: str, step: int) -> None:
    (folder / "trainer_state.json").write_text(
        json.dumps({"run_id": run_id, "global_step": step}) + "\n"
    )


@pytest.fixture(scope="session")
def full_checkpoint(model_dir: Path, eval_root: Path) -> Path:
    """``<run>/final/`` of a full fine-tuning run: ``model/`` + ``trainer_state.json``."""
    final = eval_root / "run_full" / "final"
    shutil.copytree(model_dir, final / "model")
    _trainer_state(final, "tiny-full-s0", 10)
    return final


@pytest.fixture(scope="session")
def lora_checkpoint(model_dir: Path, eval_root: Path) -> Path:
    """``<run>/final/`` of a LoRA run: ``adapter/`` (random, non-zero B so it changes the
    model) with the tokenizer/processor files alongside, + ``trainer_state.json``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    final = eval_root / "run_lora" / "final"
    base = Qwen3VLForConditionalGeneration.from_pretrained(model_dir)
    torch.manual_seed(1)
    lora = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj"]),
    )
    lora.save_pretrained(final / "adapter")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(final / "adapter")
    build_image_processor(MAX_PIXELS).save_pretrained(final / "adapter")
    _trainer_state(final, "tiny-lora-s0", 12)
    return final


@pytest.fixture(scope="session", params=["full", "lora"])
def checkpoint(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_checkpoint")
