"""The paper scale is one whole config, and its plan shows every cell's effective settings.

`snakemake --profile slurm` once merged config/paper.yaml over config/cpu.yaml, so every
key the paper config did not set came from the CPU scale (each paper cell trained the CPU
grid's 4 epochs). These tests hold the rule of experiments/workflow_config.py, keep
config/paper.yaml complete, and compare the plan's settings of every paper cell with the
table below, whose every value names where it comes from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.grid import build_grid
from experiments.plan import SOURCES, build_plan, markdown
from experiments.workflow_config import CPU_CONFIG, PAPER_CONFIG, effective_config, load_files

# Sections whose keys are names a scale chooses (its models), not settings.
NAME_MAPS = {("train", "models")}
BUDGETS = {"ultrachat": 12288, "llava": 12288, "sharegpt4o": 14336, "mmmix": 12288}
# Every paper cell's settings: (expected value, or a function of the cell's row; source).
EXPECTED: dict[str, tuple[Any, str]] = {
    "epochs": (lambda r: 2 if r["cell"].endswith(".e2") else 1,
               "ours: 1 a run (the paper reports single runs); the staleness ablation's 2"),
    "lr": (lambda r: 1e-4 if r["mode"] == "lora" else 1e-5,
           "recipe: 1e-5 full; LoRA 1e-4 (LLaMA-Factory's LoRA SFT examples)"),
    "cutoff_len": (16384, "recipe: cutoff_len 16384"),
    "token_budget": (lambda r: int(m[1]) if (m := re.search(r"\.b(\d+)(\.|$)", r["cell"]))
                     else BUDGETS[r["dataset"]],
                     "paper: 12288 UltraChat, 14336 ShareGPT4o; recipe 12288 otherwise"),
    "batch_size": (lambda r: 1 if r["method"] in ("standard", "sorted") else None,
                   "recipe: per_device_train_batch_size 1"),
    "grad_accum_steps": (1, "ours: not stated by the paper"),
    "gpus_per_node": (8, "paper: 8x H20 per node"),
    "ranks_per_node": (8, "paper: one rank per GPU"),
    "save_every": (500, "ours: preemption safety, timed apart"),
    "dtype": ("bfloat16", "paper: bf16"),
    "strategy": ("deepspeed", "paper: DeepSpeed ZeRO-2"),
    "device": ("cuda", "ours: a job without its GPUs exits before training"),
    "max_samples": (0, "paper: every record"),
    "holdout_samples": (1000, "ours: a seeded 1000-record validation split"),
    "prefetch_factor": (lambda r: None if r["method"] != "odb" else
                        int(m[1]) if (m := re.search(r"prefetch_factor-(\d+)", r["cell"]))
                        else 16, "ours: 16 per worker (config/paper.yaml says why)"),
}


def _missing_keys(base: Mapping, other: Mapping, path: tuple = ()) -> list[str]:
    missing = []
    for key, value in base.items():
        where = (*path, key)
        if where in NAME_MAPS:
            continue
        if key not in other:
            missing.append(".".join(where))
        elif isinstance(value, Mapping) and isinstance(other[key], Mapping):
            missing += _missing_keys(value, other[key], where)
    return missing


def test_paper_config_sets_every_key_the_cpu_config_has() -> None:
    cpu, paper = (yaml.safe_load(p.read_text()) for p in (CPU_CONFIG, PAPER_CONFIG))
    assert _missing_keys(cpu, paper) == []
    # the check itself: a key taken out of the paper config is named
    del paper["train"]["epochs"], paper["ablations"]["staleness"]["max_samples"]
    assert _missing_keys(cpu, paper) == ["train.epochs", "ablations.staleness.max_samples"]


def test_a_config_that_names_its_scale_is_taken_whole() -> None:
    paper = yaml.safe_load(PAPER_CONFIG.read_text())
    assert effective_config(paper) == paper  # nothing of the CPU scale added
    assert load_files(PAPER_CONFIG) == paper
    overlay = Path(PAPER_CONFIG.parent, "rehearsal.yaml")
    rehearsal = load_files(PAPER_CONFIG, overlay)
    assert rehearsal["train"]["epochs"] == 1 and rehearsal["scale"].startswith("paper-")


def test_without_a_scale_the_cpu_config_is_the_base_under_the_given_values() -> None:
    config = effective_config({"train": {"epochs": 2}})
    assert config["scale"] == "CPU-proxy" and config["train"]["epochs"] == 2
    assert config["train"]["budgets"] == yaml.safe_load(CPU_CONFIG.read_text())["train"][
        "budgets"]


@pytest.fixture(scope="module")
def paper_plan() -> dict:
    return build_plan(load_files(PAPER_CONFIG))


def test_every_paper_cell_has_the_expected_settings(paper_plan: dict) -> None:
    grid = build_grid(load_files(PAPER_CONFIG))
    rows = paper_plan["cells"]
    assert sorted(r["cell"] for r in rows) == sorted(grid.cells)  # 100% of the cells
    wrong = []
    for row in rows:
        for key, (expected, _source) in EXPECTED.items():
            want = expected(row) if callable(expected) else expected
            if row[key] != want:
                wrong.append(f"{row['cell']}: {key}={row[key]!r}, expected {want!r}")
    assert wrong == [], "\n".join(wrong[:20])


def test_the_plan_names_sources_jobs_and_cost(paper_plan: dict, tmp_path: Path) -> None:
    assert set(SOURCES) >= {"model", "data", "method", "token_budget", "batch_size",
                            "cutoff_len", "epochs", "lr", "grad_accum_steps",
                            "nodes_x_gpus", "save_every", "seed"}
    assert all(SOURCES.values())
    jobs = paper_plan["jobs"]
    assert jobs["train"] == len(paper_plan["cells"]) and jobs["evaluate"] > jobs["train"]
    # 8B UltraChat Standard on one node: (207,865 - 1,000) samples at the predicted rate,
    # which is the one the model's constants were fitted to (5.77), the paper's beside it
    row = next(r for r in paper_plan["cells"] if r["cell"] == "ultrachat.standard.8b-full-n1-s0")
    assert row["samples_per_s"] == pytest.approx(5.77, abs=0.01)
    assert row["published_samples_per_s"] == 5.77
    assert row["gpu_hours"] == pytest.approx(206_865 / (row["samples_per_s"] / 8) / 3600, rel=1e-3)
    assert row["wall_hours"] == pytest.approx(row["gpu_hours"] / 8, abs=0.01)
    assert "step-cost model over the ultrachat proxy" in row["estimate_basis"]
    total = paper_plan["gpu_hours"]
    assert total["cells_estimated"] + total["cells_without_estimate"] == len(paper_plan["cells"])
    text = markdown(paper_plan)
    assert all(f"| {r['cell']} |" in text for r in paper_plan["cells"])
    assert "Estimated GPU-hours" in text and "not a measurement" in text
    low, high = total["range"]
    assert low <= total["total_estimated"] * 1.0001 and high > total["total_estimated"]
    assert "range" in text


def test_the_cpu_plan_keeps_the_cpu_grids_epochs() -> None:
    plan = build_plan(effective_config({}))
    assert {r["epochs"] for r in plan["cells"] if not r["cell"].endswith(".e4")} == {4}
    assert plan["gpu_hours"]["cells_estimated"] == 0  # no published rate for the tiny model
