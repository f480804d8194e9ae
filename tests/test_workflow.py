"""The Snakemake workflow: lint, dry-runs of both profiles, the grid's contracts, and one
tiny real target run end to end through snakemake (data -> cache -> train -> eval ->
tables) in a scratch working directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from experiments.grid import build_grid, refuse_renamed

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _snakemake(*args: str, cwd: Path = ROOT, timeout: int = 180) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def _job_counts(text: str) -> Counter:
    stats = text.split("Job stats:")[1].split("Reasons")[0]
    return Counter({m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)})


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


def test_lint_is_clean() -> None:
    assert "Congratulations, your workflow is in a good condition" in _snakemake("--lint")


def test_default_profile_dry_run_is_the_cpu_grid() -> None:
    out = _snakemake("-n", "--forceall", "--cores", "2")
    jobs = _job_counts(out)
    grid = build_grid(_config("cpu.yaml"))
    assert jobs["train"] == len(grid.cells)
    assert jobs["report"] == 1 and jobs["proxies"] == 1
    assert "run.scale=CPU-proxy" in out and "--nproc_per_node 2" in out
    assert "srun" not in out


# Snakemake parses the paper grid (hundreds of jobs) in a subprocess: seconds.
@pytest.mark.slow
def test_slurm_profile_dry_run_lists_the_paper_grid_with_resources() -> None:
    out = _snakemake("--profile", "slurm", "-n", "--forceall")
    jobs = _job_counts(out)
    assert jobs["total"] >= 200 and jobs["train"] >= 150 and jobs["evaluate"] >= 250, jobs
    assert "run.scale=paper" in out and "proxies" not in jobs  # the staged hub, not proxies
    assert jobs["stage"] == 1 and jobs["mm_mix"] == 1
    blocks = out.split("\nrule ")
    two_node = [b for b in blocks if b.startswith("train:") and re.search(r"cell=\S+-n2-", b)]
    assert two_node and all(
        "nodes=2" in b
        and "mpi=srun" in b
        and "gres=gpu:8" in b
        and "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 64 python -m "
        "torch.distributed.run" in b
        and "--rdzv_backend c10d" in b
        for b in two_node
    )
    train = [b for b in blocks if b.startswith("train:")]
    evals = [b for b in blocks if b.startswith("evaluate:")]
    assert evals and all("gres=gpu:1" in b for b in evals)
    # GPU jobs and CPU jobs go to the profile's two partitions
    assert all("slurm_partition=gpu" in b for b in train + evals)
    caches = [b for b in blocks if b.startswith("length_cache:")]
    assert caches and all("slurm_partition=cpu" in b for b in caches)
    # one scale, whole: every job gets the paper config's values, none of the CPU scale's
    # (once each paper cell inherited the CPU grid's train.epochs=4 and cache_repeats 3)
    for block in train:
        cell = re.search(r"cell=(\S+)", block)[1]
        epochs = re.findall(r"optim\.epochs=(\d+)", block)
        assert epochs and int(epochs[-1]) == (2 if cell.endswith(".e2") else 1), cell
    assert all("--repeats 1 " in b for b in caches)
    for cpu_value in ("results/data/assets/processor", "model/tiny.yaml", "optim.lr=1.0e-3"):
        assert cpu_value not in out, cpu_value


def test_paper_grid_holds_the_papers_cells() -> None:
    grid = build_grid(_config("paper.yaml"))
    main = [grid.cells[n] for n in grid.tables["throughput"]]
    assert not [c for c in main if c.method == "packing" and c.data != "ultrachat"]
    assert {(c.model, c.mode, c.nodes) for c in main if c.data == "sharegpt4o"} == {
        ("2b", "full", 1),
        ("2b", "lora", 1),
        ("8b", "full", 1),
        ("8b", "lora", 1),
        ("2b", "full", 2),
        ("8b", "full", 2),
    }
    assert sorted(c.seed for c in main if c.data == "mmmix" and c.method == "odb") == [0, 1, 2]
    budgets = {c.data: c.budget for c in main}
    assert budgets["ultrachat"] == 12288 and budgets["sharegpt4o"] == 14336


def test_packing_on_a_multimodal_dataset_is_refused() -> None:
    config = _config("cpu.yaml")
    config["grid"][1]["methods"].append("packing")
    with pytest.raises(ValueError, match="packing is text-only"):
        build_grid(config)


def test_the_former_train_engine_key_is_refused_naming_strategy() -> None:
    config = _config("cpu.yaml")
    config["train"]["engine"] = config["train"].pop("strategy")
    with pytest.raises(ValueError, match=r"^train.engine was renamed train.strategy \(.*\); "
                       "write strategy: ddp under train: in the workflow config$"):
        refuse_renamed(config)
    refuse_renamed(_config("cpu.yaml"))  # the shipped configs use the new key


def test_an_ablation_at_the_default_setting_is_the_main_cell() -> None:
    grid = build_grid(_config("cpu.yaml"))
    policy = grid.tables["policy"]
    assert "ultrachat.odb.tiny-full-n1-s0" in policy  # policy=balanced is the default
    assert "ultrachat.odb.tiny-full-n1-s0.policy-paper" in policy


def test_cache_and_train_agree_on_the_data_config() -> None:
    """The length cache is built from grid.data_args, the run from its --config layers and
    overrides: both must give the same DataConfig, or the run refuses the cache as stale."""
    from experiments.data.records import DataConfig
    from experiments.train.config_files import load_config

    for config in (_config("cpu.yaml"), _config("paper.yaml")):
        grid = build_grid(config)
        for name in grid.cells:
            if not grid.needs_cache(name):
                continue
            words = grid.train_args(name).split()
            files = [w for p, w in zip(words, words[1:], strict=False) if p == "--config"]
            overrides = [w.strip("'") for w in words if "=" in w]
            cfg = load_config([ROOT / f for f in files], overrides)
            assert cfg.data == DataConfig(**grid.data_args(grid.cells[name].data)), name


@pytest.mark.slow
def test_a_tiny_target_runs_end_to_end(tmp_path: Path) -> None:
    """Real rules, real runs: proxies -> assets -> length cache -> train (GMT and ODB, one
    rank each) -> validation-loss evaluation -> two paper tables; then nothing left to do.

    Small runs: 8 training records and 8 held out, a warm-up epoch and one timed one
    (the grid's 4 epochs of 16 records would only repeat the same path), one length-cache
    pass; one rank a run and one core a job, so independent jobs run side by side."""
    config = _config("cpu.yaml")
    config["data"].update(proxy_samples=200, leverage_samples=100)
    per_dataset = dict.fromkeys(("ultrachat", "llava", "sharegpt4o", "mmmix"))
    config["train"].update(
        max_samples=dict.fromkeys(per_dataset, 16), holdout_samples=dict.fromkeys(per_dataset, 8),
        epochs=2, cache_repeats=1,
    )
    # One rank a run, one core a job: the ODB run trains while the cache builds, GMT's
    # while ODB's checkpoint is evaluated (W=2 through torchrun: tests/experiments/train).
    config["train"]["models"]["tiny"].update(procs_per_node=1, threads=1)
    config["grid"] = [
        {
            "datasets": ["ultrachat"],
            "methods": ["gmt", "odb"],
            "models": ["tiny"],
            "modes": ["full"],
            "nodes": [1],
            "seeds": [0],
        }
    ]
    config["evaluate"].update(
        methods=["odb"], benchmarks={"text": ["val_loss"], "multimodal": ["val_loss"]}
    )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    for shared in ("experiments", "eval"):  # config layers and fixtures, by relative path
        (tmp_path / shared).symlink_to(ROOT / shared)
    targets = ["table_cache", "table_quality"]
    args = [
        "-s",
        str(ROOT / "Snakefile"),
        "-d",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "config.yaml"),
        "--cores",
        "2",
    ]
    _snakemake(*args, *targets, timeout=280)
    cache = json.loads((tmp_path / "results/paper/tables/cache.json").read_text())["data"]
    assert {d["method"] for d in cache} == {"gmt", "odb"}
    assert next(d for d in cache if d["method"] == "gmt")["build_seconds"]["median"] > 0
    assert all(d["epoch_seconds"]["low"] > 0 for d in cache)
    quality = json.loads((tmp_path / "results/paper/tables/quality.json").read_text())["data"]
    val = json.loads(
        (tmp_path / "results/eval/ultrachat.odb.tiny-full-n1-s0/val_loss.json").read_text()
    )
    odb = next(d for d in quality if d["method"] == "odb")
    assert odb["val_loss"] == val["metrics"]["loss"] > 0  # the evaluation's, not the run's
    gmt = next(d for d in quality if d["method"] == "gmt")
    assert gmt["val_loss"] > 0 and gmt["mmlu"] is None  # the run's own, no benchmark
    run = json.loads((tmp_path / "results/train/ultrachat.odb.tiny-full-n1-s0/result.json")
                     .read_text())
    assert [t["epoch"] for t in run["epoch_timings"]] == [0, 1]  # the config's train.epochs
    # Each epoch's data wait and alignment round time (the depth and policy tables' figures)
    assert all(t["round_ms"] > 0 for t in run["epoch_timings"])
    assert sum(t["data_wait_s"] for t in run["epoch_timings"]) <= run["data_wait_s"] + 1e-3
    curves = tmp_path / "results/train/ultrachat.odb.tiny-full-n1-s0/tensorboard"
    assert any(curves.glob("events.out.tfevents.*")), "the run keeps its training curves"
    assert "Nothing to be done" in _snakemake(*args, *targets, "-n")


def test_paper_jobs_read_only_the_staged_cache() -> None:
    """Every dataset, model and evaluation file of the paper grid comes from stage.cache,
    and one the stage spec omits is refused when the grid is built, naming the key."""
    config = _config("paper.yaml")
    grid = build_grid(config)
    cache = config["stage"]["cache"]
    for name in grid.cells:
        args = grid.train_args(name)
        assert f"data.processor={cache}/models/" in args and f"model.path={cache}/models/" in args
        source = grid.data_args(grid.cells[name].data)["source"]
        assert source.startswith((f"{cache}/datasets/", "results/data/")), (name, source)
    unstaged = _config("paper.yaml")
    del unstaged["stage"]["spec"]["datasets"]["liuhaotian/LLaVA-Instruct-150K"]
    with pytest.raises(ValueError, match="data.datasets.llava: a staged dataset needs `hub`"):
        build_grid(unstaged)
    unstaged = _config("paper.yaml")
    unstaged["stage"]["spec"]["models"].remove("Qwen/Qwen3-VL-8B-Instruct")
    with pytest.raises(ValueError, match="Qwen3-VL-8B-Instruct is not staged"):
        build_grid(unstaged)


def test_cpu_grid_times_three_epochs_after_a_warm_up_in_every_run() -> None:
    grid = build_grid(_config("cpu.yaml"))
    for name, cell in grid.cells.items():
        epochs = [w for w in grid.train_args(name).split() if w.startswith("optim.epochs=")]
        assert epochs[-1] == f"optim.epochs={cell.epochs or 4}", name  # the last one wins


def test_cells_run_grouped_by_dataset_with_each_reference_before_its_methods() -> None:
    grid = build_grid(_config("cpu.yaml"))
    order = grid.run_order()
    assert sorted(order) == sorted(grid.cells)
    bases = [grid.variants[grid.cells[n].data].dataset for n in order]
    runs = [b for i, b in enumerate(bases) if i == 0 or bases[i - 1] != b]
    assert len(runs) == len(set(runs)), runs  # each dataset's cells form one block
    for variant in {grid.cells[n].data for n in order}:
        cells = [n for n in order if grid.cells[n].data == variant]
        block = order[order.index(cells[0]):order.index(cells[-1]) + 1]
        assert block == cells, variant  # each data variant's cells are adjacent too
        if any(grid.cells[n].method == "standard" for n in cells):
            assert grid.cells[cells[0]].method == "standard", variant
    priorities = [grid.priority(n) for n in order]
    assert priorities == sorted(priorities, reverse=True) and priorities[-1] == 1
    for data in {grid.cells[n].data for n in grid.cells if grid.needs_cache(n)}:
        users = [n for n in grid.cells if grid.cells[n].data == data and grid.needs_cache(n)]
        assert grid.cache_priority(data) == max(map(grid.priority, users)) + 1
