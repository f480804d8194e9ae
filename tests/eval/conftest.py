"""Shared fixtures: a small MM-Mix proxy, a local tokenizer/processor and a tiny Qwen3-VL,
built once per session (a few seconds), plus a held-out split of that proxy."""

from pathlib import Path

import pytest

from experiments.data.assets import (
    build_image_processor,
    build_tiny_model,
    corpus_from_proxies,
    train_tokenizer,
)
from experiments.data.pipeline import DataConfig, PreprocessedDataset
from experiments.data.proxies import ProxyConfig, write_proxy

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
