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


def test_data_from_run_scores_the_runs_own_heldout_split(
    full_checkpoint, proxy_dir, model_dir, tmp_path
) -> None:
    import dataclasses
    import shutil

    from tests.eval.conftest import heldout_config

    run = tmp_path / "run" / "final"
    shutil.copytree(full_checkpoint, run)
    data = dataclasses.asdict(heldout_config(proxy_dir, model_dir)) | {"holdout": False}
    (run / "trainer_state.json").write_text(
        json.dumps({"run_id": "r", "global_step": 1, "config": {"data": data}})
    )
    from_run = val_loss.main(
        [
            "--checkpoint",
            str(run),
            "--out",
            str(tmp_path / "a.json"),
            "--data-from-run",
            "--token-budget",
            "4096",
        ]
    )
    explicit = val_loss.main(
        [
            "--checkpoint",
            str(run),
            "--out",
            str(tmp_path / "b.json"),
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
    assert from_run["metrics"]["loss"] == pytest.approx(explicit["metrics"]["loss"], rel=1e-9)
    assert from_run["items_scored"] == HOLDOUT_SAMPLES
    with pytest.raises(FileNotFoundError, match="no trainer_state.json with the run's config"):
        val_loss.main(
            [
                "--checkpoint",
                str(full_checkpoint),
                "--out",
                str(tmp_path / "c.json"),
                "--data-from-run",
            ]
        )
    with pytest.raises(ValueError, match="leave source"):
        ValLossConfig("c", "o.json", data_from_run=True, source="s")
