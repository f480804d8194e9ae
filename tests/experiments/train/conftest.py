"""Fixtures of the train tests: a tiny saved model and a base config layer over the
session's proxies (tests/experiments/conftest.py), small enough for seconds-long runs."""

from pathlib import Path

import pytest
import yaml

from experiments.data.assets import build_tiny_model
from experiments.data.pipeline import PreprocessedDataset

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "experiments" / "configs"
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="session")
def tiny_model_dir(processor_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(processor_dir)
    build_tiny_model(tokenizer, seed=0, out_dir=out)
    tokenizer.save_pretrained(out)
    return out


def base_layer(proxy_root: Path, processor_dir: Path, model_dir: Path, **data) -> dict:
    """The CPU layers plus this session's paths: 40 UltraChat records (8 held out)."""
    return {
        "include": [str(CONFIGS / "scale" / "cpu.yaml"), str(CONFIGS / "model" / "tiny.yaml"),
                    str(CONFIGS / "method" / "odb.yaml"), str(CONFIGS / "mode" / "full.yaml"),
                    str(CONFIGS / "strategy" / "ddp.yaml")],
        "run": {"out_dir": "unset", "log_every": 1},
        "model": {"path": str(model_dir)},
        "data": {"dataset": "ultrachat", "source": str(proxy_root / "ultrachat"),
                 "processor": str(processor_dir), "max_samples": 40, "holdout_samples": 8,
                 "cutoff_len": 1024, **data},
        "method": {"token_budget": 2048, "num_workers": 0},
        "train": {"max_steps": 3, "lr": 1.0e-3},
        "validation": {"enabled": False},
    }


@pytest.fixture(scope="session")
def base_config(proxy_root: Path, processor_dir: Path, tiny_model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("train_config") / "base.yaml"
    path.write_text(yaml.safe_dump(base_layer(proxy_root, processor_dir, tiny_model_dir)))
    return path


@pytest.fixture(scope="session")
def ultrachat_train(proxy_root: Path, processor_dir: Path) -> PreprocessedDataset:
    from experiments.data.pipeline import DataConfig

    return PreprocessedDataset(DataConfig("ultrachat", str(proxy_root / "ultrachat"),
                                          str(processor_dir), cutoff_len=1024, max_samples=40,
                                          holdout_samples=8))
