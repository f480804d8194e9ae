"""``python -m eval.val_loss`` on full and LoRA checkpoints writes a schema-valid record."""

import json

import pytest

from eval import val_loss
from eval.config import ValLossConfig
from eval.results import PIPELINE_CHECK, validate_result
from tests.eval.conftest import HOLDOUT_SAMPLES, MAX_PIXELS


def test_command_writes_a_valid_record(checkpoint, proxy_dir, tmp_path) -> None:
    out = tmp_path / "val_loss.json"
    val_loss.main(
        [
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--dataset",
            "mmmix",
            "--source",
            str(proxy_dir),
            "--holdout-samples",
            str(HOLDOUT_SAMPLES),
            "--image-max-pixels",
            str(MAX_PIXELS),
            "--token-budget",
            "4096",
        ]
    )
    record = json.loads(out.read_text())
    validate_result(record)
    assert record["benchmark"] == "val_loss" and record["scale"] == PIPELINE_CHECK
    assert record["checkpoint"]["run_id"] == f"tiny-{checkpoint.parent.name[4:]}-s0"
    assert record["items_scored"] == HOLDOUT_SAMPLES and record["metrics"]["tokens"] > 0
    assert 0 < record["metrics"]["loss"] < 20


def test_config_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="holdout_samples must be >= 1, got 0"):
        ValLossConfig("c", "o.json", dataset="mmmix", source="s", holdout_samples=0)
    with pytest.raises(ValueError, match="dataset must be one of"):
        ValLossConfig("c", "o.json", dataset="coco", source="s", holdout_samples=2)
