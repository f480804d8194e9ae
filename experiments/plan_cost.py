"""Every planned cell's predicted samples/s and GPU-hours from the step-cost model.

A cell's epoch is built over its own proxy's samples (lengths and images:
:mod:`experiments.plan_schedules`) with its own method, budget, batch size and ranks
(nodes x GPUs per node), and timed by :class:`odb.planning.step_cost.StepModel` for its
own model (2B or 8B), mode (full or LoRA, the LoRA rank of its config) and strategy, on the
paper's GPU (H20, 8 a node) with gradient checkpointing (``config/scale/paper.yaml``).
The paper's published rate is set beside it where one exists for the same dataset, model
and method. The total's range comes from the held-out errors of the paper's samples/s
rows (``docs/bench/plan_heldout.json``, made by ``python -m bench.plan_heldout``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from experiments.data.proxy_plans import LeverageConfig, calibrate_leverage
from experiments.plan_schedules import Samples, proxy_samples, schedule, text_samples
from odb.planning.hardware import gpu
from odb.planning.models import architecture
from odb.planning.step_cost import Setup, StepModel

HELDOUT = Path("docs/bench/plan_heldout.json")
PLAN_GPU = "h20"  # the paper's: 8x H20 per node
STRATEGIES = {"deepspeed": "zero2", "ddp": "ddp", "fsdp": "fsdp"}
MODELS = {"2b": "qwen3-vl-2b", "8b": "qwen3-vl-8b"}


@lru_cache(maxsize=32)
def leverage_samples(cv: float, short_fraction: float, num_samples: int = 2000) -> Samples:
    """A leverage mix's text-only samples, calibrated as ``write_leverage`` calibrates."""
    cfg = LeverageConfig(cv, short_fraction, num_samples=num_samples)
    _, _, lengths = calibrate_leverage(cfg, cutoff_len=16384)
    return text_samples(cfg.name, lengths.tolist())


def cell_samples(variant: Any) -> tuple[Samples, str]:
    """The samples a cell's data variant is timed on, and what they are."""
    tags = dict(variant.tags)
    if "cv" in tags:
        return leverage_samples(float(tags["cv"]), float(tags["short_fraction"])), (
            f"the {variant.key} mix (2,000 samples)"
        )
    note = f"the {variant.dataset} proxy (2,000 samples)"
    if variant.augmented:
        note += ", its un-augmented lengths"
    return proxy_samples(variant.dataset), note


def predict(variant: Any, row: Mapping[str, Any], lora_rank: int) -> float:
    """Predicted samples/s of one cell (all its GPUs)."""
    samples, _ = cell_samples(variant)
    world = row["nodes"] * row["gpus_per_node"]
    setup = Setup(
        architecture(MODELS[row["model_key"]]),
        gpu(PLAN_GPU),
        STRATEGIES.get(row["strategy"], "zero2"),
        world,
        row["gpus_per_node"],
        mode=row["mode"],
        lora_rank=lora_rank,
        packed=row["method"] == "packing",
    )
    sched = schedule(
        samples,
        row["method"],
        world,
        budget=row["token_budget"],
        batch_size=row["batch_size"] or 1,
        seed=row["seed"],
    )
    return StepModel(setup).samples_per_s(sched)


def heldout_range(path: Path = HELDOUT) -> tuple[float, float] | None:
    """``(lowest, highest)`` error of the held-out paper samples/s rows, or None."""
    if not path.is_file():
        return None
    rows = json.loads(path.read_text()).get("rows", [])
    errors = [
        r["error"] for r in rows if r["what"].startswith("paper") and r["unit"] == "samples/s"
    ]
    return (min(errors), max(errors)) if errors else None
