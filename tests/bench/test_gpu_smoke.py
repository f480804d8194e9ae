"""The GPU smoke script's runs load as valid train configs with the paper's settings.

The script itself needs a GPU to mean anything (``bench/gpu_smoke.py``; its CPU wiring
run takes minutes), so the suite checks what it would start: each method's command line
is a config the train entry point accepts, at the paper's scale settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.gpu_smoke import BUDGET, train_command
from experiments.train.config_files import load_config


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_gpu_smoke_runs_are_paper_scale_train_configs(method: str, tmp_path: Path) -> None:
    args = argparse.Namespace(model="qwen3-vl-2b", device="cuda", samples=160)
    cmd = train_command(method, args, tmp_path / "sharegpt4o", tmp_path / "assets",
                        tmp_path / method)
    start = cmd.index("experiments.train") + 1
    layers = [cmd[i + 1] for i in range(start, len(cmd)) if cmd[i] == "--config"]
    overrides = [w for w in cmd[start:] if "=" in w]
    cfg = load_config(layers, overrides)
    assert cfg.model.architecture == "qwen3-vl-2b" and cfg.model.init == "random"
    assert cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing
    assert cfg.strategy.name == "deepspeed" and cfg.strategy.zero_stage == 2
    assert cfg.method.name == method and cfg.method.token_budget == BUDGET
    assert cfg.data.cutoff_len == 16384 and cfg.data.max_samples == 160
    if method == "standard":
        assert cfg.method.baseline["batch_size"] == 1
