"""The plan before the run: what a workflow config will train, with which settings, and
what it will cost.

For every training cell of the grid the plan loads the run config its job will load
(the same layers and overrides, through ``experiments.train.config_files.load_config``) and
reports the settings that decide its cost and its numbers, each beside where the value
comes from (:data:`SOURCES`: the paper's text, the authors' LLaMA-Factory recipe, or our
stated choice). It counts the jobs per rule and predicts every cell's samples/s and GPU-hours with
the step-cost model over the cell's own samples, method, budget, model, mode and ranks
(:mod:`experiments.plan_cost`), the paper's published rate beside it where one exists
(:data:`PUBLISHED_RATES`), and the total with the range the held-out errors give.

    snakemake --profile slurm plan      # results/paper/PLAN.md and PLAN.json
    python -m experiments.plan --config-json "$(cat cfg.json)" --out-dir results/paper
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.grid import build_grid
from experiments.grid_cells import Grid
from experiments.plan_cost import MODELS, cell_samples, heldout_range, predict

# Where each planned setting's value comes from. "paper" = the ODB paper's text;
# "recipe" = the authors' LLaMA-Factory recipe (odb-example-llamafactory,
# scripts/prepare_lf_training.py) and odb-mm-mix-hf-trainer; "ours" = a choice of this
# artifact, with its reason (config/paper.yaml says more).
SOURCES = {
    "model": "paper Sec. 4: Qwen3-VL-2B/8B-Instruct, full fine-tuning and LoRA",
    "data": "paper Sec. 4: UltraChat 200k, LLaVA-Instruct-150K, ShareGPT4o 57K, MM-Mix "
            "(hub files: config/paper.yaml stage.spec)",
    "method": "paper Sec. 4: Standard, Sorted, GMT, BMT, Packing (text only), ODB",
    "token_budget": "paper ablation: best L_max 12288 (UltraChat), 14336 (ShareGPT4o); "
                    "LLaVA and MM-Mix 12288: recipe (odb_max_input_length 12288)",
    "batch_size": "recipe: per_device_train_batch_size 1 for Standard and Sorted",
    "cutoff_len": "recipe: cutoff_len 16384",
    "epochs": "ours: 1 (the paper reports single runs; timed over the whole loop)",
    "lr": "recipe: learning_rate 1e-5, cosine, warmup_ratio 0.03",
    "grad_accum_steps": "ours: 1 (not stated in the paper or recipe)",
    "nodes_x_gpus": "paper: 8x H20 per node; 1 node (full, LoRA) and 2 nodes (full)",
    "save_every": "ours: a checkpoint every 500 optimizer steps (preemption), timed apart",
    "seed": "paper: single runs (seed 0); MM-Mix seeds 0-2: ours (repeats not stated)",
    "prefetch_factor": "recipe: 512 (ODB); ours 16 per worker (config/paper.yaml: why)",
    "dtype": "paper: bf16",
    "strategy": "paper: DeepSpeed ZeRO-2",
    "device": "ours: cuda, a job without its GPUs exits before training",
}

# Samples/s the paper publishes (ODB README "Benchmarks And Paper"), by (dataset, model,
# method): (samples/s, GPUs of that run).
PUBLISHED_RATES: dict[tuple[str, str, str], tuple[float, int]] = {
    ("ultrachat", "8b", "standard"): (5.77, 8), ("ultrachat", "8b", "odb"): (10.23, 8),
    ("llava", "8b", "standard"): (14.38, 8), ("llava", "8b", "odb"): (24.87, 8),
    ("sharegpt4o", "8b", "standard"): (2.37, 8), ("sharegpt4o", "8b", "odb"): (5.83, 8),
    ("mmmix", "2b", "standard"): (17.85, 16), ("mmmix", "2b", "odb"): (79.15, 16),
}
# Records a run reads at max_samples 0 (every record): the hub files' sizes.
DATASET_RECORDS = {
    "ultrachat": 207_865,   # ultrachat_200k train_sft (dataset card)
    "llava": 157_712,       # llava_instruct_150k.json
    "sharegpt4o": 57_300,   # LLaVA-OneVision-Data sharegpt4o, "57.3K" (its paper's table)
    "mmmix": 206_526,       # the public mix (config data.mm_mix.records)
}


@dataclass(frozen=True)
class Estimate:
    """GPU-hours of one cell, and which published rate it rests on."""

    gpu_hours: float | None
    wall_hours: float | None
    basis: str
    samples_per_s: float | None = None
    published_samples_per_s: float | None = None


def cell_settings(grid: Grid, name: str) -> dict[str, Any]:
    """The planned settings of cell ``name``, as its job's run config holds them."""
    from experiments.train.config import FIXED_BATCH
    from experiments.train.config_files import load_config

    layers, overrides = grid.train_invocation(name)
    cfg = load_config(layers, overrides)
    cell = grid.cells[name]
    model = grid.config["train"]["models"][cell.model]
    batch = None
    if cfg.method.name in FIXED_BATCH:
        batch = cfg.method.baseline.get("batch_size",
                                        cfg.method.token_budget // cfg.data.cutoff_len)
    return {
        "cell": name, "model": model.get("hub") or cell.model,
        "dataset": grid.variants[cell.data].dataset, "data": cfg.data.source,
        "method": cfg.method.name, "mode": cfg.mode, "token_budget": cfg.method.token_budget,
        "batch_size": batch, "cutoff_len": cfg.data.cutoff_len, "epochs": cfg.optim.epochs,
        "lr": cfg.optim.lr, "grad_accum_steps": cfg.optim.grad_accum_steps,
        "nodes": cell.nodes, "gpus_per_node": model["gpus_per_node"],
        "ranks_per_node": model["procs_per_node"], "save_every": cfg.run.save_every,
        "seed": cfg.run.seed, "dtype": cfg.model.dtype, "strategy": cfg.strategy.name,
        "device": cfg.strategy.device,
        "prefetch_factor": cfg.method.odb.get("prefetch_factor") if cfg.method.name == "odb"
        else None,
        "max_samples": cfg.data.max_samples, "holdout_samples": cfg.data.holdout_samples,
        "runtime_min": model["runtime"],
        "lora_rank": cfg.lora.r if cfg.mode == "lora" else None,
    }


def estimate(grid: Grid, row: Mapping[str, Any]) -> Estimate:
    """One cell's predicted samples/s and GPU-hours (the step-cost model over its own
    samples and settings), with the paper's published rate beside it where one exists."""
    cell = grid.cells[row["cell"]]
    variant = grid.variants[cell.data]
    if cell.model not in MODELS:
        return Estimate(None, None, f"no architecture for model {cell.model}")
    rate = predict(variant, {**row, "model_key": cell.model}, row["lora_rank"] or 8)
    leverage = "cv" in dict(variant.tags)
    records = grid.config["data"]["leverage_samples"] if leverage else DATASET_RECORDS[
        variant.dataset]  # fmt: skip
    samples = ((row["max_samples"] or records) - row["holdout_samples"]) * row["epochs"]
    gpus = max(1, row["nodes"] * row["gpus_per_node"])
    gpu_hours = samples / rate * gpus / 3600
    published = None
    paper = PUBLISHED_RATES.get((variant.dataset, cell.model, row["method"]))
    if paper and not leverage and not variant.augmented and row["mode"] == "full" \
            and paper[1] == gpus:  # the published run's own setting only
        published = paper[0]
    basis = f"step-cost model over {cell_samples(variant)[1]}"
    return Estimate(round(gpu_hours, 1), round(gpu_hours / gpus, 2), basis, round(rate, 2),
                    published)  # fmt: skip


def job_counts(grid: Grid) -> dict[str, int]:
    """Jobs per rule of a full run (the ``all`` target), from the grid."""
    config = grid.config
    caches = {c.data for n, c in grid.cells.items() if grid.needs_cache(n)}
    return {
        "train": len(grid.cells),
        "evaluate": sum(len(grid.benchmarks(n)) for n in grid.cells),
        "length_cache": len(caches),
        "length_stats": len(config["data"]["datasets"]),
        "tables": len([t for t in grid.tables if grid.tables[t]]),
    }


def build_plan(config: Mapping[str, Any]) -> dict[str, Any]:
    """The plan of a (validated) workflow config: cells, sources, jobs and cost."""
    grid = build_grid(config)
    rows = []
    for name in grid.run_order():
        row = cell_settings(grid, name)
        est = estimate(grid, row)
        row.update(gpu_hours=est.gpu_hours, wall_hours=est.wall_hours, estimate_basis=est.basis,
                   samples_per_s=est.samples_per_s,
                   published_samples_per_s=est.published_samples_per_s)  # fmt: skip
        rows.append(row)
    known = [r["gpu_hours"] for r in rows if r["gpu_hours"] is not None]
    errors = heldout_range()
    return {"scale": config["scale"], "hardware": config["hardware"], "sources": SOURCES,
            "jobs": job_counts(grid), "cells": rows,
            "gpu_hours": {"total_estimated": round(sum(known), 1),
                          "range": None if errors is None else
                          [round(sum(known) * (1 + e), 1) for e in errors],
                          "range_from": "held-out errors of the paper's samples/s rows "
                                        "(docs/bench/plan_heldout.json)",
                          "cells_estimated": len(known),
                          "cells_without_estimate": len(rows) - len(known)},
            "over_runtime": [r["cell"] for r in rows
                             if r["wall_hours"] and r["wall_hours"] * 60 > r["runtime_min"]]}


COLUMNS = ("cell", "model", "method", "token_budget", "batch_size", "cutoff_len", "epochs",
           "lr", "grad_accum_steps", "nodes", "gpus_per_node", "save_every", "seed",
           "prefetch_factor", "samples_per_s", "published_samples_per_s", "gpu_hours",
           "wall_hours")


def markdown(plan: Mapping[str, Any]) -> str:
    """PLAN.md: the totals, where each setting comes from, then one row per cell."""
    g = plan["gpu_hours"]
    lines = [
        f"# Plan: {plan['scale']} scale", "",
        f"Hardware: {plan['hardware']}. Made by `python -m experiments.plan` from the "
        "workflow config; every value below is what the cell's job will receive.", "",
        f"**Estimated GPU-hours: {g['total_estimated']:,}**{_range(g)} over "
        f"{g['cells_estimated']} training cells ({g['cells_without_estimate']} without an "
        "architecture to model; evaluations, caches and data jobs not included). Each "
        "cell's samples/s is predicted by the step-cost model (odb.planning.step_cost: the "
        "cell's model, mode, method, budget and ranks on 8x H20 a node, over its own proxy "
        "samples), the paper's published rate beside it where one exists; an estimate, not "
        "a measurement (docs/plan.md: the model's held-out errors).", "",
        "Jobs per rule: " + ", ".join(f"{k} {v}" for k, v in plan["jobs"].items()) + ".", "",
    ]
    if plan["over_runtime"]:
        lines += ["Cells whose estimated wall time passes their Slurm runtime: "
                  + ", ".join(plan["over_runtime"]), ""]
    lines += ["## Where the values come from", "", "| setting | source |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in plan["sources"].items()]
    lines += ["", "## Cells", "", "| " + " | ".join(COLUMNS) + " |",
              "|" + "---|" * len(COLUMNS)]
    for row in plan["cells"]:
        lines.append("| " + " | ".join("-" if row[c] is None else str(row[c])
                                        for c in COLUMNS) + " |")
    lines += ["", "Estimate bases:", ""]
    lines += sorted({f"- {r['estimate_basis']}" for r in plan["cells"]})
    return "\n".join(lines) + "\n"


def _range(g: Mapping[str, Any]) -> str:
    if not g.get("range"):
        return " (no held-out range: run python -m bench.plan_heldout)"
    low, high = sorted(g["range"])
    return f" (range {low:,} to {high:,} from the {g['range_from']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-json", required=True, help="the workflow config as JSON")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    plan = build_plan(json.loads(args.config_json))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "PLAN.json").write_text(json.dumps(plan, indent=1) + "\n")
    (args.out_dir / "PLAN.md").write_text(markdown(plan))
    g = plan["gpu_hours"]
    print(f"{len(plan['cells'])} cells, ~{g['total_estimated']:,} GPU-hours estimated; "
          f"{args.out_dir / 'PLAN.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
