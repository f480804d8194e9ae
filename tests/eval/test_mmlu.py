"""MMLU through lm-eval (HFLM + TaskManager) on the local ``mmlu_local`` group, offline."""

import json
from pathlib import Path

import pytest
import yaml

from eval import mmlu
from eval.config import MMLUConfig
from eval.results import PIPELINE_CHECK, validate_result

FIXTURES = Path(__file__).parents[2] / "eval" / "fixtures" / "mmlu"


# lm-eval builds the task and scores in process: ~6 s a checkpoint kind on 2 idle cores.
@pytest.mark.slow
def test_command_writes_a_valid_record(checkpoint, tmp_path) -> None:
    out = tmp_path / "mmlu.json"
    mmlu.main(
        [
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--task",
            "mmlu_local",
            "--task-files",
            str(FIXTURES),
            "--num-fewshot",
            "1",
        ]
    )
    record = json.loads(out.read_text())
    validate_result(record)
    assert (record["task"], record["shots"], record["chat_template"]) == ("mmlu_local", 1, False)
    assert record["scale"] == PIPELINE_CHECK and record["data"]["local"]
    assert record["checkpoint"]["run_id"].startswith("tiny-")
    assert set(record["per_category"]) == set(mmlu.CATEGORIES)
    assert record["items_scored"] == 12 == sum(v["items"] for v in record["per_category"].values())
    per_subject = record["metrics"]["per_subject"]
    overall = sum(v["accuracy"] * v["items"] for v in per_subject.values()) / 12
    assert record["accuracy"] == pytest.approx(overall)  # weight_by_size, as lm-eval's mmlu


def test_local_task_copies_lm_eval_mmlu_settings(tmp_path) -> None:
    out = mmlu.write_local_tasks(FIXTURES, tmp_path)
    task = yaml.safe_load((out / "mmlu_local_nutrition.yaml").read_text())
    real = yaml.safe_load((mmlu._lm_eval_mmlu_dir() / "_default_template_yaml").read_text())
    for key in (
        "doc_to_text",
        "doc_to_choice",
        "doc_to_target",
        "fewshot_config",
        "output_type",
        "test_split",
        "fewshot_split",
    ):
        assert task[key] == real[key]
    assert task["tag"] == "mmlu_local_other_tasks" and task["dataset_path"] == "json"
    assert Path(task["dataset_kwargs"]["data_files"]["test"][0]).is_absolute()


def test_task_files_with_missing_fields_fail_clearly(tmp_path) -> None:
    bad = tmp_path / "files" / "nutrition"
    bad.mkdir(parents=True)
    (bad / "dev.jsonl").write_text((FIXTURES / "nutrition" / "dev.jsonl").read_text())
    (bad / "test.jsonl").write_text(json.dumps({"question": "q", "choices": list("abcd")}) + "\n")
    with pytest.raises(ValueError, match=r"line 1 lacks field\(s\) \['subject', 'answer'\]"):
        mmlu.write_local_tasks(tmp_path / "files", tmp_path / "tasks")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mmlu.write_local_tasks(tmp_path / "nowhere", tmp_path / "tasks")


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="needs task_files"):
        MMLUConfig("c", "o.json", task="mmlu_local")
    with pytest.raises(ValueError, match="num_fewshot must be >= 0, got -1"):
        MMLUConfig("c", "o.json", num_fewshot=-1)
