"""Writes the frozen fixtures of the paper-script tests (run by hand, output committed).

    python -m tests.paper.make_fixtures          # fixtures/ and golden/ under tests/paper

The grid is config/cpu.yaml's as it was when the fixtures were made; the results are
synthetic, deterministic and carry only the fields the paper scripts read, with values
chosen so every table has something to show (ODB faster than Standard, GMT/BMT with a
cache cost, violations under augmentation). The golden outputs are what the scripts
wrote from them, checked by eye once; tests/paper/test_paper.py compares against them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import yaml

from experiments.grid import build_grid

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPEED = {"standard": 1.0, "sorted": 1.3, "gmt": 2.2, "bmt": 2.3, "packing": 2.5, "odb": 2.1}
BASE = {"ultrachat": 4.0, "llava": 6.0, "sharegpt4o": 2.0, "mmmix": 5.0}


def _jitter(name: str) -> float:
    return int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) / 65535 * 0.1


def result(name: str, cell: dict) -> dict:
    method, dataset = cell["method"], cell["dataset"]
    tput = BASE[dataset] * SPEED[method] * (1 + _jitter(name))
    if cell["tags"]:
        tput *= 1 + (cell["tags"]["cv"] * cell["tags"]["short_fraction"] if method == "odb" else 0)
    options = cell["options"]
    if "prefetch_factor" in options:
        tput *= 1 + 0.05 * options["prefetch_factor"]
    tput *= (cell["budget"] / cell["default_budget"]) ** 0.5 if method == "odb" else 1
    wall = round(64 / tput, 3)
    cached = method in ("sorted", "gmt", "bmt", "packing")
    stats = {
        "budget_fill": round(0.6 + _jitter(name), 4),
        "mean_round_ms": round(10 + 100 * _jitter(name), 3),
        "recirculated": 0,
        "carried": 0 if options.get("join", True) else 3,
    }
    if method != "odb":
        stats["budget_violations"] = 5 if cell["augmented"] and cached else 0
        stats["max_violation_fill"] = 1.4 if cell["augmented"] and cached else 0.0
    odb_cfg = {k: v for k, v in options.items()}
    return {
        "throughput_samples_per_s": round(tput, 4),
        "train_wall_s": wall,
        "emitted_samples": 64 if options.get("join", True) else 58,
        "padding_efficiency": round(0.5 + 0.4 * (method != "standard") + _jitter(name), 4),
        "idle_fraction": 0.0 if method != "odb" else round(_jitter(name) / 10, 4),
        "data_wait_s": round(wall * (0.5 / (1 + options.get("prefetch_factor", 2))), 3),
        "steps": 10,
        "epochs": cell["epochs"] or 1,
        "world_size": 2,
        "nodes": 1,
        "validation": {"loss": round(8.0 + _jitter(name + "v"), 4), "tokens": 1, "samples": 1},
        "length_cache": {
            "path": "x",
            "build_seconds": round(3 + 10 * _jitter(name), 2),
            "built_in_run": False,
        }
        if cached
        else None,
        "loader_stats": stats,
        "git_commit": "fixture0",
        "hardware": {"cpu_count": 2, "gpu": None},
        "config": {"method": {"num_workers": 1, "odb": odb_cfg}},
    }


def evaluation(name: str, benchmark: str) -> dict:
    if benchmark == "val_loss":
        return {
            "benchmark": benchmark,
            "accuracy": None,
            "metrics": {"loss": round(8.0 + _jitter(name + "e"), 4)},
        }
    metrics = {"unparsed": 3} if benchmark == "mmmu_gen" else {}
    return {
        "benchmark": benchmark,
        "accuracy": round(0.25 + _jitter(name + benchmark), 4),
        "metrics": metrics,
    }


def main() -> None:
    fixtures = HERE / "fixtures"
    shutil.rmtree(fixtures, ignore_errors=True)
    config = yaml.safe_load((ROOT / "config" / "cpu.yaml").read_text())
    manifest = build_grid(config).manifest()
    for name, cell in manifest["cells"].items():
        path = fixtures / cell["result"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result(name, cell), indent=1, sort_keys=True) + "\n")
        for benchmark, rel in cell["evals"].items():
            (fixtures / rel).parent.mkdir(parents=True, exist_ok=True)
            (fixtures / rel).write_text(json.dumps(evaluation(name, benchmark)) + "\n")
    (fixtures / "grid.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    from tests.paper.test_paper import run_all

    golden = HERE / "golden"
    shutil.rmtree(golden, ignore_errors=True)
    run_all(golden)
    for png in golden.glob("figures/*.png"):
        png.unlink()  # figures are checked for existence and size, not bytes
    print(f"fixtures -> {fixtures}, golden -> {golden}")


if __name__ == "__main__":
    main()
