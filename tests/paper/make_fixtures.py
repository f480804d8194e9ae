"""Writes the frozen fixtures of the paper-script tests (run by hand, output committed).

    python -m tests.paper.make_fixtures              # results/ and golden/ under tests/paper
    python -m tests.paper.make_fixtures --new-grid   # grid.json anew from config/cpu.yaml

The grid is ``fixtures/grid.json``: config/cpu.yaml's grid as it was when the fixtures
were made (``--new-grid`` makes it anew from today's config). The results are synthetic
and deterministic, complete records of the train result schema
(``experiments/schemas/train_result.json``), with values chosen so every table has
something to show (ODB faster than Standard, GMT/BMT with a cache cost, violations under
augmentation) and every verdict of the claim rule occurs: the UltraChat and LLaVA cells
time 4 epochs (a warm-up + 3 measurements, the machine's drift met alike by every run;
each epoch with its data wait, ODB's with its round time), so ODB is "faster" than
Standard in the full settings, "within noise" in UltraChat's LoRA one (no real gain, a
run's own noise on top), the budgets 4096 and 16384 and the depths 1 and 4 are "slower"
and "faster" than their defaults, the policy ``paper`` is "within noise" of
``balanced``; the staleness cells
time 2 epochs (one measurement after the warm-up); the rest time their one epoch ("too
few measurements"). The golden outputs are what the scripts wrote from them;
tests/paper/test_paper.py compares against them, and tests/paper/test_fixtures.py
validates the results and recomputes table cells from them by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from experiments.grid import build_grid

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPEED = {"standard": 1.0, "sorted": 1.3, "gmt": 2.2, "bmt": 2.3, "packing": 2.5, "odb": 2.1}
BASE = {"ultrachat": 4.0, "llava": 6.0, "sharegpt4o": 2.0, "mmmix": 5.0}
STEPS = {"standard": 32, "sorted": 32, "gmt": 12, "bmt": 12, "packing": 9, "odb": 10}  # an epoch
# Cells whose results time each epoch (epoch_timings); every other cell is an older result
# with one whole-run figure, so its verdicts read "too few measurements".
TIMED = ("ultrachat.", "llava.", "llava-aug")
TIMED_EPOCHS = 4  # UltraChat, LLaVA: 1 warm-up + 3 measurements (staleness cells run 2)
# The machine's speed at each epoch position, met alike by every timed run (interleaved
# repeats); epoch 0 is the slow warm-up that the tables drop.
DRIFT = (0.6, 1.0, 0.85, 1.1)
# A run's own noise, larger than its small difference from the reference: its pairings
# straddle 1 and must read "within noise".
WOBBLE = (1.0, 1.15, 0.9, 1.1)
WOBBLY = {"ultrachat.odb.tiny-lora-n1-s0", "ultrachat.odb.tiny-full-n1-s0.policy-paper"}
NO_GAIN = {"ultrachat.odb.tiny-lora-n1-s0"}  # ODB as fast as Standard, give or take noise
SCHEMA_ID = "odb-train-result/2"  # experiments/schemas/train_result.json's $id
TOKENS_PER_SAMPLE = 600  # real tokens of every emitted sample
PARAMETERS = 1_000_000  # the tiny model's; LoRA trains 2% of them


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


def _wait_share(cell: dict) -> float:
    """The share of a run's time spent waiting for data: less with a deeper prefetch."""
    return 0.5 / (1 + cell["options"].get("prefetch_factor", 2))


def _timing(name: str, cell: dict, per_epoch: int, steps: int) -> dict:
    """Epochs, samples, wall time and throughput; every epoch's timing (the timed cells
    time several, the rest their one)."""
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
            "epoch_timings": [{"epoch": 0, "wall_s": wall, "samples": per_epoch, "steps": steps}],
        }
    epochs = cell["epochs"] or TIMED_EPOCHS
    timings = _timings(name, tput, epochs, per_epoch, steps)
    for k, t in enumerate(timings):  # what a real run records per epoch beside its time
        t["data_wait_s"] = round(t["wall_s"] * _wait_share(cell) * (1 + _jitter(f"{name}#w{k}")), 4)
        if cell["method"] == "odb":
            t["round_ms"] = round(10 + 100 * _jitter(f"{name}#r{k}"), 3)
    wall = sum(t["wall_s"] for t in timings)
    return {
        "epochs": epochs,
        "emitted_samples": per_epoch * epochs,
        "train_wall_s": round(wall, 3),
        "throughput_samples_per_s": round(per_epoch * epochs / wall, 4),
        "steps": steps * epochs,
        "epoch_timings": timings,
    }


def result(name: str, cell: dict, scale: str) -> dict:
    """The result record of cell ``name`` of a grid at ``scale``."""
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
    real_tokens = timing["emitted_samples"] * TOKENS_PER_SAMPLE
    padded_tokens = round(real_tokens / efficiency)
    return {
        **timing,
        **_run_fields(name, cell, scale),
        "real_tokens": real_tokens,
        "padded_tokens": padded_tokens,
        "real_tokens_per_s": round(real_tokens / wall, 4),
        "padded_tokens_per_s": round(padded_tokens / wall, 4),
        "padding_efficiency": efficiency,
        "optimizer_steps": timing["steps"],
        "idle_fraction": idle_fraction,
        "idle_steps": round(idle_fraction * timing["steps"] * 2),
        "data_wait_s": round(wall * _wait_share(cell), 3),
        "segments": 1,
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
        "config": _config(name, cell, scale, timing["epochs"], odb_cfg),
    }


def _run_fields(name: str, cell: dict, scale: str) -> dict[str, Any]:
    """What a run records about itself: identity, model size, loss curve, provenance."""
    trainable = PARAMETERS if cell["mode"] == "full" else PARAMETERS // 50
    loss = round(8.5 + _jitter(name + "l"), 4)
    return {
        "schema": SCHEMA_ID,
        "run_id": name,
        "scale": scale,
        "method": cell["method"],
        "dataset": cell["dataset"],
        "model": cell["model"],
        "mode": cell["mode"],
        "strategy": "ddp",
        "token_budget": cell["budget"],
        "grad_accum_steps": 1,
        "peak_memory": {"rss_bytes": 2**30, "gpu_bytes": None},
        "parameters": {"total": PARAMETERS, "trainable": trainable},
        "loss_curve": [{"step": 1, "loss": loss, "lr": 0.0001}],
        "final_train_loss": loss,
        "git_commit": "fixture0",
        "versions": {"odb": "fixture0", "torch": "fixture0"},
        "hardware": {"cpu_count": 2, "gpu": None},
        "started": "2026-01-01T00:00:00+00:00",
        "finished": "2026-01-01T00:05:00+00:00",
    }


def _config(name: str, cell: dict, scale: str, epochs: int, odb_cfg: dict) -> dict[str, Any]:
    return {
        "run": {"name": name, "scale": scale},
        "model": {"name": cell["model"]},
        "data": {"dataset": cell["data"]},
        "method": {"num_workers": 1, "odb": odb_cfg},
        "mode": cell["mode"],
        "strategy": {"name": "ddp"},
        "optim": {"epochs": epochs, "grad_accum_steps": 1},
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-grid", action="store_true",
                        help="make grid.json anew from config/cpu.yaml (changes the golden)")
    args = parser.parse_args(argv)
    fixtures = HERE / "fixtures"
    manifest = _grid(fixtures / "grid.json", args.new_grid)
    shutil.rmtree(fixtures, ignore_errors=True)
    for name, cell in manifest["cells"].items():
        path = fixtures / cell["result"]
        path.parent.mkdir(parents=True, exist_ok=True)
        record = result(name, cell, manifest["scale"])
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
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


def _grid(frozen: Path, new: bool) -> dict[str, Any]:
    """The frozen grid, or config/cpu.yaml's today (``new``, or none frozen yet)."""
    if frozen.exists() and not new:
        return json.loads(frozen.read_text())
    config = yaml.safe_load((ROOT / "config" / "cpu.yaml").read_text())
    return build_grid(config).manifest()


if __name__ == "__main__":
    main()
