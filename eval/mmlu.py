"""MMLU through lm-eval's own task machinery and its ``hf`` model.

The loaded checkpoint and its tokenizer are wrapped in lm-eval's ``HFLM`` and scored
with ``simple_evaluate``: on the cluster the standard ``mmlu`` group (``cais/mmlu`` from
the hub, 57 subjects in 4 categories); offline, the ``mmlu_local`` group built by
`write_local_tasks` from local files in the ``cais/mmlu`` fields (the project's jsonl
fixtures, or the hub's parquet layout as staged by ``experiments.data.stage``). The local
group copies lm-eval's own MMLU task settings (prompt, choices, few-shot sampler,
per-subject description and category tag) and changes only where the data comes from
(``dataset_path: json`` or ``parquet``), so both runs take the same code path. Shots and
chat-template use are settings and go into the result.

    python -m eval.mmlu --checkpoint runs/x/final --out results/eval/x/mmlu.json
    python -m eval.mmlu --checkpoint runs/x/final --task mmlu_local \\
        --task-files eval/fixtures/mmlu --out results/eval/x/mmlu_local.json
    python -m eval.mmlu --checkpoint runs/x/final --task mmlu_local \\
        --task-files <cache>/datasets/cais/mmlu --out results/eval/x/mmlu_local.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

CATEGORIES = ("stem", "humanities", "social_sciences", "other")
MMLU_FIELDS = ("question", "subject", "choices", "answer")
LOCAL_TASK = "mmlu_local"
SPLITS = ("test", "dev")
# cais/mmlu's folders that are not subjects: every subject's rows together, and the
# auxiliary training set.
HUB_AGGREGATES = ("all", "auxiliary_train")


def _lm_eval_mmlu_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "mmlu" / "default"


def _rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_rows(path: Path) -> int:
    rows = _rows(path)
    if not rows:
        raise ValueError(f"MMLU task file {path} has no rows")
    for n, row in enumerate(rows, 1):
        missing = [f for f in MMLU_FIELDS if f not in row]
        if missing:
            raise ValueError(
                f"MMLU task file {path} line {n} lacks field(s) {missing}; "
                f"every row needs {list(MMLU_FIELDS)} (the cais/mmlu fields)"
            )
        if len(row["choices"]) != 4 or row["answer"] not in (0, 1, 2, 3):
            raise ValueError(
                f"MMLU task file {path} line {n}: need 4 choices and an answer "
                f"index 0-3, got {len(row['choices'])} choices and answer "
                f"{row['answer']!r}"
            )
    return len(rows)


def _split_files(folder: Path) -> tuple[str, dict[str, list[Path]]]:
    """(lm-eval dataset_path, {split: files}) of one subject folder: ``{test,dev}.jsonl``
    (the project's fixtures) or ``{test,dev}-*.parquet`` (the ``cais/mmlu`` hub layout)."""
    jsonl = {split: folder / f"{split}.jsonl" for split in SPLITS}
    if any(p.exists() for p in jsonl.values()):
        builder, files = "json", {k: [v] if v.exists() else [] for k, v in jsonl.items()}
    else:
        builder = "parquet"
        files = {split: sorted(folder.glob(f"{split}-*.parquet")) for split in SPLITS}
    for split, paths in files.items():
        if not paths:
            raise FileNotFoundError(
                f"MMLU subject {folder.name} lacks its {split} split: no {split}.jsonl or "
                f"{split}-*.parquet in {folder}"
            )
    return builder, files


def subject_folders(root: Path) -> list[Path]:
    """The subject folders of an MMLU folder, sorted by name: every sub-folder but hidden
    ones (``snapshot_download(local_dir=...)`` leaves ``.cache/huggingface/`` in each
    repository) and the hub's `HUB_AGGREGATES` (``all/``, ``auxiliary_train/``).

    Example:
        >>> [p.name for p in subject_folders(Path("<cache>/datasets/cais/mmlu"))][:2]
        ...                                                   # doctest: +SKIP
        ['abstract_algebra', 'anatomy']
    """
    return sorted(
        (p for p in root.iterdir()
         if p.is_dir() and not p.name.startswith(".") and p.name not in HUB_AGGREGATES),
        key=lambda p: p.name,
    )


def _subject_task(folder: Path) -> dict:
    """lm-eval's ``mmlu_<subject>`` task, reading ``folder``'s files instead of the hub."""
    real = _lm_eval_mmlu_dir()
    subject = folder.name
    spec_path = real / f"mmlu_{subject}.yaml"
    if not spec_path.exists():
        raise ValueError(
            f"{folder} is not an MMLU subject (lm-eval has no "
            f"mmlu_{subject}); name folders after cais/mmlu configs"
        )
    builder, files = _split_files(folder)
    for path in (p for paths in files.values() for p in paths):
        _check_rows(path)
    spec = yaml.safe_load(spec_path.read_text())
    task = yaml.safe_load((real / "_default_template_yaml").read_text())
    task.update(
        task=f"{LOCAL_TASK}_{subject}",
        task_alias=subject,
        description=spec["description"],
        tag=spec["tag"].replace("mmlu_", f"{LOCAL_TASK}_", 1),
        dataset_path=builder,
        dataset_name=None,
        dataset_kwargs={"data_files": {k: [str(p) for p in v] for k, v in files.items()}},
    )
    return task


def write_local_tasks(task_files: str | Path, out_dir: str | Path) -> Path:
    """Write the ``mmlu_local`` group's task YAML into ``out_dir``; returns ``out_dir``.

    ``task_files`` holds one folder per MMLU subject (names as lm-eval's
    ``mmlu_<subject>`` tasks) with either ``test.jsonl`` and ``dev.jsonl`` (the project's
    fixtures) or ``test-*.parquet`` and ``dev-*.parquet`` (``cais/mmlu`` as the hub stores
    it, e.g. a staged ``<cache>/datasets/cais/mmlu``; its ``all/``, ``auxiliary_train/``
    and hidden folders are not subjects, see `subject_folders`). Paths in the YAML are
    absolute because lm-eval resolves ``data_files`` against the working directory.

    Raises:
        FileNotFoundError: a folder or split file is missing.
        ValueError: an unknown subject, or rows with missing fields.
    """
    root = Path(task_files).resolve()
    if not root.is_dir():
        raise FileNotFoundError(
            f"MMLU task folder {root} does not exist; write it with "
            f"python -m experiments.data.task_fixtures or pass --task-files"
        )
    subjects = [p.name for p in subject_folders(root)]
    if not subjects:
        raise FileNotFoundError(f"MMLU task folder {root} has no <subject>/ folders")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for subject in subjects:
        task = _subject_task(root / subject)
        (out / f"{LOCAL_TASK}_{subject}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    aggregate = [{"metric": "acc", "weight_by_size": True}]
    present = {
        yaml.safe_load((out / f"{LOCAL_TASK}_{s}.yaml").read_text())["tag"] for s in subjects
    }
    categories = [c for c in CATEGORIES if f"{LOCAL_TASK}_{c}_tasks" in present]
    for c in categories:
        group = {
            "group": f"{LOCAL_TASK}_{c}",
            "group_alias": c,
            "task": [f"{LOCAL_TASK}_{c}_tasks"],
            "aggregate_metric_list": aggregate,
            "metadata": {"version": 2},
        }
        (out / f"_{LOCAL_TASK}_{c}.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    top = {
        "group": LOCAL_TASK,
        "task": [f"{LOCAL_TASK}_{c}" for c in categories],
        "aggregate_metric_list": aggregate,
        "metadata": {"version": 2},
    }
    (out / f"_{LOCAL_TASK}.yaml").write_text(yaml.safe_dump(top, sort_keys=False))
    return out


def summarise(results: dict, task: str) -> dict:
    """Overall, per-category and per-subject accuracy with item counts from lm-eval's
    ``simple_evaluate`` output for the group ``task`` (``mmlu`` or ``mmlu_local``)."""
    scores, counts = results["results"], results["n-samples"]
    if task not in scores:
        raise ValueError(f"lm-eval returned no result for {task!r}; got {sorted(scores)[:8]}")
    subjects = {name[len(task) + 1 :]: name for name in counts if name.startswith(f"{task}_")}
    per_subject = {
        s: {"accuracy": scores[n]["acc,none"], "items": counts[n]["effective"]}
        for s, n in sorted(subjects.items())
    }
    # a group's sample_len is the number of items under it (lm-eval's own count)
    per_category = {
        c: {
            "accuracy": scores[f"{task}_{c}"]["acc,none"],
            "items": int(scores[f"{task}_{c}"]["sample_len"]),
        }
        for c in CATEGORIES
        if f"{task}_{c}" in scores
    }
    items = sum(v["items"] for v in per_subject.values())
    return {
        "accuracy": scores[task]["acc,none"],
        "items": items,
        "per_category": per_category,
        "per_subject": per_subject,
    }


def run(cfg) -> dict:
    """Load ``cfg.checkpoint``, run lm-eval, write and return the record."""
    import tempfile

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from eval.checkpoint import load_checkpoint
    from eval.results import result_record, write_result

    started = time.perf_counter()
    model, tokenizer, _, meta = load_checkpoint(
        cfg.checkpoint, dtype=cfg.torch_dtype, device=cfg.device
    )
    with tempfile.TemporaryDirectory(prefix="mmlu_tasks-") as tmp:
        include = write_local_tasks(cfg.task_files, tmp) if cfg.task_files else None
        manager = TaskManager(include_path=str(include) if include else None)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=cfg.batch_size)
        results = simple_evaluate(
            model=lm,
            tasks=[cfg.task],
            task_manager=manager,
            num_fewshot=cfg.num_fewshot,
            apply_chat_template=cfg.apply_chat_template,
            fewshot_as_multiturn=cfg.apply_chat_template,
            limit=cfg.limit or None,
            bootstrap_iters=0,
            log_samples=False,
        )
    summary = summarise(results, cfg.task)
    record = result_record(
        "mmlu",
        config=cfg,
        meta=meta,
        model=model,
        task=cfg.task,
        split="test",
        shots=cfg.num_fewshot,
        chat_template=cfg.apply_chat_template,
        items_scored=summary["items"],
        items_excluded=0,
        accuracy=summary["accuracy"],
        per_category=summary["per_category"],
        metrics={"per_subject": summary["per_subject"], "metric": "acc"},
        source=str(cfg.task_files) if cfg.task_files else "cais/mmlu",
        local_data=cfg.task_files is not None,
        started=started,
    )
    write_result(record, cfg.out)
    return record


def main(argv: list[str] | None = None) -> dict:
    from eval.config import DTYPES, MMLUConfig

    parser = argparse.ArgumentParser(
        prog="python -m eval.mmlu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, help="result JSON path")
    parser.add_argument("--task", default="mmlu", help="mmlu (hub) or mmlu_local")
    parser.add_argument("--task-files", default=None, help="local MMLU folder (mmlu_local)")
    parser.add_argument("--num-fewshot", type=int, default=0)
    parser.add_argument("--apply-chat-template", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    args = parser.parse_args(argv)
    record = run(MMLUConfig(**vars(args)))
    print(json.dumps({k: record[k] for k in ("benchmark", "task", "accuracy", "scale")}))
    return record


if __name__ == "__main__":
    main()
