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


def test_hidden_and_aggregate_folders_are_not_subjects(tmp_path) -> None:
    """A folder as ``snapshot_download(local_dir=...)`` stages ``cais/mmlu``: its
    ``.cache/huggingface/`` bookkeeping and the hub's ``all/`` and ``auxiliary_train/``
    beside the subject folders."""
    import shutil

    staged = tmp_path / "mmlu"
    shutil.copytree(FIXTURES, staged)
    download = staged / ".cache" / "huggingface" / "download"
    (download / "nutrition").mkdir(parents=True)
    (download.parent / ".gitignore").write_text("*")
    (download / "nutrition" / "test.jsonl.metadata").write_text("c0ffee\nbeef\n1.0\n")
    for aggregate, split in (("all", "test"), ("all", "dev"), ("auxiliary_train", "train")):
        (staged / aggregate).mkdir(exist_ok=True)
        shutil.copy(FIXTURES / "nutrition" / "dev.jsonl", staged / aggregate / f"{split}.jsonl")
    subjects = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    out = mmlu.write_local_tasks(staged, tmp_path / "tasks")
    assert sorted(p.name for p in out.glob(f"{mmlu.LOCAL_TASK}_*.yaml")) == [
        f"{mmlu.LOCAL_TASK}_{s}.yaml" for s in subjects]
    assert [p.name for p in mmlu.subject_folders(staged)] == subjects


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
