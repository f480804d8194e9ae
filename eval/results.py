"""One result JSON per (checkpoint, benchmark), validated against ``result.schema.json``.

Every evaluator builds its record with `result_record` and writes it with `write_result`,
so a table script can rely on one shape. Scores of tiny models or of the local fixture
tasks are pipeline checks; `scale_label` says so in the record itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path

SCHEMA_PATH = Path(__file__).with_name("result.schema.json")
# Below this many parameters a model is a CPU proxy (the real models have >= 2B).
PROXY_PARAMETERS = 100_000_000
PIPELINE_CHECK = "CPU-proxy (tiny random model): pipeline check, not a quality claim"
LOCAL_TASKS = "local fixture task files: pipeline check, not a quality claim"


def scale_label(model, local_data: bool) -> str:
    """How the number may be read: a pipeline check (tiny model or local fixtures) or a
    real score at the model's size."""
    n = sum(p.numel() for p in model.parameters())
    if n < PROXY_PARAMETERS:
        return PIPELINE_CHECK
    if local_data:
        return LOCAL_TASKS
    return f"paper scale ({n / 1e9:.2f}B parameters, full benchmark data)"


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm-eval")


def result_record(
    benchmark: str,
    *,
    config,
    meta,
    model,
    task: str,
    split: str,
    shots: int,
    chat_template: bool,
    items_scored: int,
    items_excluded: int,
    accuracy: float | None,
    per_category: dict,
    metrics: dict,
    source: str,
    local_data: bool,
    started: float,
) -> dict:
    """The common record (see the schema for each field)."""
    return {
        "schema_version": 1,
        "benchmark": benchmark,
        "task": task,
        "split": split,
        "shots": shots,
        "chat_template": chat_template,
        "items_scored": items_scored,
        "items_excluded": items_excluded,
        "accuracy": accuracy,
        "per_category": per_category,
        "metrics": metrics,
        "lm_eval_version": lm_eval_version(),
        "checkpoint": meta.as_record(),
        "scale": scale_label(model, local_data),
        "data": {"source": source, "local": local_data},
        "config": _plain(asdict(config) if is_dataclass(config) else config),
        "elapsed_s": round(time.perf_counter() - started, 3),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def validate_result(record: dict) -> None:
    """Raise ``jsonschema.ValidationError`` when ``record`` breaks the result schema."""
    import jsonschema

    jsonschema.validate(record, json.loads(SCHEMA_PATH.read_text()))


def write_result(record: dict, path: str | Path) -> Path:
    """Validate ``record`` and write it to ``path`` (parents created); returns the path."""
    validate_result(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
