"""Writes the frozen fixtures of the paper-script tests (run by hand, output committed).

    python -m tests.paper.make_fixtures          # fixtures/ and golden/ under tests/paper

The grid is config/cpu.yaml's as it was when the fixtures were made; the results are
synthetic, deterministic and carry only the fields the paper scripts read, with values
chosen so every table has something to show (ODB faster than Standard, GMT/BMT with a
cache cost, violations under augmentation) and every verdict of the claim rule occurs:
the UltraChat cells time 4 epochs (a warm-up + 3 measurements, the machine's drift met
alike by every run), so ODB is "faster" than Standard in the full setting, "within
noise" in the LoRA one (no real gain, a run's own noise on top), the budgets 4096 and
16384 are "slower" and "faster" than 8192, the policy ``paper`` is "within noise" of
``balanced``; the staleness cells time 2 epochs (one measurement after the warm-up); the
rest are older results without ``epoch_timings`` ("too few measurements"). The golden
outputs are what the scripts wrote from them, checked by eye once;
tests/paper/test_paper.py compares against them.
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
STEPS = {"standard": 32, "sorted": 32, "gmt": 12, "bmt": 12, "packing": 9, "odb": 10}  # an epoch
# Cells whose results time each epoch (epoch_timings); every other cell is an older result
# with one whole-run figure, so its verdicts read "too few measurements".
TIMED = ("ultrachat.", "llava-aug")
TIMED_EPOCHS = 4  # UltraChat: 1 warm-up + 3 measurements (the staleness cells run 2)
# The machine's speed at each epoch position, met alike by every timed run (interleaved
# repeats); epoch 0 is the slow warm-up that the tables drop.
DRIFT = (0.6, 1.0, 0.85, 1.1)
# A run's own noise, larger than its small difference from the reference: its pairings
# straddle 1 and must read "within noise".
WOBBLE = (1.0, 1.15, 0.9, 1.1)
WOBBLY = {"ultrachat.odb.tiny-lora-n1-s0", "ultrachat.odb.tiny-full-n1-s0.policy-paper"}
NO_GAIN = {"ultrachat.odb.tiny-lora-n1-s0"}  # ODB as fast as Standard, give or take noise


def _jitter(name: str) -> float:
    return int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) / 65535 * 0.1


def _throughput(name: str, cell: dict) -> float:
    """The run's speed before drift: the dataset's base, the method's factor, the
    setting's effect (leverage, depth, budget) and <= 10% of per-cell jitter."""
    method, options = cell["method"], cell["options"]
    speed = 1.0 if name in NO_GAIN else SPEED[method]
    tput = BASE[cell["dataset"]] * speed * (1 + _jitter(name))
    if cell["tags"]:
        tput *= 1 + (cell["tags"]["cv"] * cell["tags"]["short_fraction"] if method == "odb" else 0)
    if "prefetch_factor" in options:
        tput *= 1 + 0.05 * options["prefetch_factor"]
    return tput * ((cell["budget"] / cell["default_budget"]) ** 0.5 if method == "odb" else 1)


def _timings(name: str, tput: float, epochs: int, samples: int, steps: int) -> list[dict]:
    """Each epoch's time: the run's speed x the machine's drift x the run's own noise
    (+-2% in every run, the large ``WOBBLE`` in the ``WOBBLY`` ones)."""
    wobble = WOBBLE if name in WOBBLY else (1.0,) * len(DRIFT)
    noise = [1 + 0.4 * (_jitter(f"{name}#{k}") - 0.05) for k in range(epochs)]
    return [
        {
            "epoch": k,
            "wall_s": round(samples / (tput * DRIFT[k] * wobble[k] * noise[k]), 4),
            "samples": samples,
            "steps": steps,
        }
        for k in range(epochs)
    ]


def _timing(name: str, cell: dict, per_epoch: int, steps: int) -> dict:
    """Epochs, samples, wall time and throughput; ``epoch_timings`` for the timed cells."""
    tput = _throughput(name, cell)
    if not name.startswith(TIMED):
        wall = round(64 / tput, 3)
        epochs = cell["epochs"] or 1
        return {
            "epochs": epochs,
            "emitted_samples": per_epoch,
            "train_wall_s": wall,
            "throughput_samples_per_s": round(tput, 4),
            "steps": steps * epochs,
        }
    epochs = cell["epochs"] or TIMED_EPOCHS
    timings = _timings(name, tput, epochs, per_epoch, steps)
    wall = sum(t["wall_s"] for t in timings)
    return {
        "epochs": epochs,
        "emitted_samples": per_epoch * epochs,
        "train_wall_s": round(wall, 3),
        "throughput_samples_per_s": round(per_epoch * epochs / wall, 4),
        "steps": steps * epochs,
        "epoch_timings": timings,
    }


def result(name: str, cell: dict) -> dict:
    method = cell["method"]
    options = cell["options"]
    timing = _timing(name, cell, 64 if options.get("join", True) else 58, STEPS[method])
    wall = timing["train_wall_s"]
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
    efficiency = round(0.5 + 0.4 * (method != "standard") + _jitter(name), 4)
    idle_fraction = 0.0 if method != "odb" else round(_jitter(name) / 10, 4)
    return {
        **timing,
        "padding_efficiency": efficiency,
        "padded_tokens": round(timing["emitted_samples"] * 600 / efficiency),
        "idle_fraction": idle_fraction,
        "idle_steps": round(idle_fraction * timing["steps"] * 2),
        "data_wait_s": round(wall * (0.5 / (1 + options.get("prefetch_factor", 2))), 3),
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
