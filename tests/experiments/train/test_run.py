"""The train entry point end to end: real torchrun ranks, the tiny Qwen3-VL, every method.

Each run is a few optimizer steps on 32 UltraChat proxy records (the base layer in
conftest.py), checked against the result schema; Standard and ODB train two whole
epochs instead, in the session's shared runs (``whole_run`` in conftest.py), which the
resume tests also read. Strategies: DDP over Gloo and DeepSpeed ZeRO-2 on CPU; modes:
full and LoRA (peft).
"""

import json
import re
from pathlib import Path

import pytest
import torch.distributed as dist

from experiments.train.config_build import ConfigError
from experiments.train.run import main
from tests.experiments.train.conftest import WHOLE_TRAIN_SAMPLES, train

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _rows(out: Path) -> list[dict]:
    """Every rank's logged micro-steps (``run.record_sample_ids``)."""
    return [json.loads(line) for rank in (0, 1)
            for line in (out / f"samples_rank{rank}.jsonl").read_text().splitlines()]


def _check_ddp_result(result: dict, out: Path, method: str) -> list[dict]:
    """What every DDP run's result and files hold; its logged rows."""
    assert (result["method"], result["world_size"], result["strategy"]) == (method, 2, "ddp")
    assert result["optimizer_steps"] == len(result["loss_curve"]) > 0  # log_every=1
    rows = _rows(out)
    assert len(rows) == 2 * result["steps"] and result["padded_tokens"] > 0
    assert result["emitted_samples"] == sum(len(row["ids"]) for row in rows) > 0
    assert result["throughput_samples_per_s"] == pytest.approx(
        result["emitted_samples"] / result["train_wall_s"], rel=1e-3)
    assert (result["length_cache"] is not None) == (method in ("sorted", "gmt", "bmt", "packing"))
    assert (out / "final" / "model" / "model.safetensors").exists()
    assert (out / "final" / "model" / "tokenizer.json").exists()
    return rows


@pytest.mark.parametrize("method", ["sorted", "gmt", "bmt", "packing"])
def test_every_method_trains_with_ddp(method: str, base_config: Path, tmp_path: Path) -> None:
    """Three steps (``optim.max_steps``) cut the epoch; Standard and ODB: the next test."""
    result = train(base_config, tmp_path, f"method/{method}.yaml",
                   overrides=("run.record_sample_ids=true",))
    rows = _check_ddp_result(result, tmp_path, method)
    assert result["optimizer_steps"] == 3
    # What the result counts is what the ranks logged: distinct training samples.
    ids = [i for row in rows for i in row["ids"]]
    assert len(ids) == len(set(ids)) == result["emitted_samples"]
    assert set(ids) <= set(range(32))  # the 32 training records; 8 are held out
    assert result["epoch_timings"] == []  # 3 steps cut the epoch: no whole-epoch figure


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_standard_and_odb_train_whole_epochs_with_ddp(method: str, whole_run) -> None:
    """Two whole epochs: each reads every training record exactly once, is timed (its
    checkpoints apart), and the held-out records are scored."""
    out, result = whole_run(method)
    rows = _check_ddp_result(result, out, method)
    for epoch in (0, 1):
        ids = sorted(i for row in rows if row["epoch"] == epoch for i in row["ids"])
        assert ids == list(range(WHOLE_TRAIN_SAMPLES)), f"epoch {epoch}"
    assert [t["epoch"] for t in result["epoch_timings"]] == [0, 1]
    assert result["validation"]["samples"] == 8 and result["validation"]["loss"] > 0
    # save_every 1: a checkpoint per optimizer step, timed apart from training
    assert result["checkpoints"] == result["optimizer_steps"] > 0 < result["checkpoint_s"]
    assert sum(t["checkpoints"] for t in result["epoch_timings"]) == result["checkpoints"]


# The method x (mode, strategy) product would repeat code paths: LoRA is the same
# for every method, and ODB is the method with windows of uneven length and IDLE
# micro-steps for DeepSpeed's accumulation boundary.
@pytest.mark.parametrize(("method", "mode", "strategy"),
                         [("standard", "lora", "ddp"), ("odb", "full", "deepspeed")])
def test_lora_and_deepspeed(method: str, mode: str, strategy: str, base_config: Path,
                            tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    result = train(base_config, tmp_path, f"method/{method}.yaml", f"mode/{mode}.yaml",
                   f"strategy/{strategy}.yaml", timeout=300, torchrun=True,
                   env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    # DeepSpeed on CPU trains without JIT-compiling any op (its shm all-reduce is skipped)
    assert not extensions.exists() or not any(extensions.iterdir())
    assert (result["mode"], result["strategy"], result["optimizer_steps"]) == (mode, strategy, 3)
    # rank 0 logs where its start-up went, phase by phase, before the first step
    startup = re.search(r"start-up ([\d.]+) s: launch and imports ([\d.]+) s, (.*)",
                        (tmp_path / "stderr.log").read_text())
    assert startup, "no start-up line in the launcher's stderr"
    phases = dict(p.rsplit(" ", 2)[:2] for p in startup.group(3).split(", "))
    assert list(phases) == ["config", "process group", "barrier", "datasets", "loader",
                            "model", "strategy"]
    total = float(startup.group(2)) + sum(float(v) for v in phases.values())
    assert total == pytest.approx(float(startup.group(1)), abs=0.1 * (len(phases) + 1))
    if mode == "lora":
        assert result["parameters"]["trainable"] < result["parameters"]["total"] / 10
        assert (tmp_path / "final" / "adapter" / "adapter_config.json").exists()
    else:
        assert (tmp_path / "final" / "model" / "model.safetensors").exists()


def test_bad_input_fails_before_any_rank_trains(base_config: Path, tmp_path: Path) -> None:
    args = ["--config", str(base_config), f"run.out_dir={tmp_path}"]
    cases = {
        "method.name=fancy": "method.name='fancy' is not allowed",
        f"data.source={tmp_path}/no/such/data": "does not exist",
        "method.odb.oversize=error": "oversize=error with data.cutoff_len=1024 > "
                                         "method.token_budget=512",
    }
    for override, message in cases.items():
        budget = ["method.token_budget=512"] if "oversize" in override else []
        with pytest.raises(ConfigError, match=message):
            main([*args, override, *budget])
        assert not dist.is_initialized()
    assert not (tmp_path / "result.json").exists()
