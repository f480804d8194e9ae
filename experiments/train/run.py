"""Train Qwen3-VL with one batching method; write checkpoints and one result JSON.

    # CPU, 2 processes, tiny model on the UltraChat proxy (after `make reproduce` made
    # results/data): about a minute
    torchrun --nproc_per_node 2 -m experiments.train \\
        --config experiments/configs/cpu_quick.yaml run.out_dir=results/train/quick

    # one GPU node, 8 GPUs, Qwen3-VL-2B full fine-tuning with DeepSpeed ZeRO-2
    torchrun --nproc_per_node 8 -m experiments.train \\
        --config experiments/configs/scale/paper.yaml \\
        --config experiments/configs/model/qwen3-vl-2b.yaml \\
        --config experiments/configs/strategy/deepspeed.yaml data.dataset=ultrachat ...

    # Slurm, 2 nodes: one srun task per node, torchrun rendezvous on the first node
    srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint "$(scontrol show hostnames $SLURM_NODELIST | head -1):29500" \\
        -m experiments.train --config ... --resume auto

Reads top to bottom: configuration (every error before any process group exists) ->
distributed set-up -> data, loader, model, strategy -> resume -> train -> final save ->
validation loss -> result JSON. ``--resume auto`` continues from the newest complete
checkpoint under ``run.out_dir`` (a fresh start when there is none).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from experiments.train.components import build_datasets, build_method_loader, build_trainable_model
from experiments.train.config import TrainConfig
from experiments.train.config_build import ConfigError
from experiments.train.config_files import load_config
from experiments.train.curves import CURVES_DIR, Curves
from experiments.train.hardware import check_machine
from experiments.train.launch import Dist, StartupClock, init_distributed, setup_logging
from experiments.train.loop import Counters, TrainLoop
from experiments.train.model import parameter_counts
from experiments.train.result import build_result, peak_memory, validate_result
from experiments.train.resume import (
    Checkpointer,
    resolve_resume,
    restore,
    save_final,
    trainer_state,
)
from experiments.train.strategy import make_strategy
from experiments.train.validation import validation_loss

log = logging.getLogger("experiments.train")


# ---------------------------------------------------------------- configuration


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.train", description=__doc__.splitlines()[0],
        epilog="Overrides: section.key=value, e.g. method.name=gmt optim.lr=2e-5")
    parser.add_argument("--config", action="append", required=True,
                        help="YAML layer (repeatable; later layers win)")
    parser.add_argument("--resume", default="none",
                        help="'auto' (newest complete checkpoint, else fresh), 'none', or a "
                             "checkpoint folder")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    return parser.parse_intermixed_args(argv)  # overrides may come before or after flags


def _looks_local(value: str) -> bool:
    return value.startswith(("/", ".", "~")) or value.count("/") >= 2 or value.endswith(
        (".json", ".jsonl", ".parquet"))


def preflight(cfg: TrainConfig) -> None:
    """Refuse what would fail later, before any process group or worker exists."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    paths = {"data.source": cfg.data.source, "data.processor": cfg.data.processor}
    if cfg.model.init == "pretrained":
        paths["model.path"] = str(cfg.model.path)
    for key, value in paths.items():
        if Path(value).exists() or (key == "data.source" and glob.glob(value)):
            continue  # a folder, a file, or a glob over staged shards that matches
        if _looks_local(value):
            raise ConfigError(f"{key}={value} does not exist; build it first (make reproduce "
                              "writes results/data/) or point it at an existing path")
        if offline:
            raise ConfigError(f"{key}={value} is not a local path and HF_HUB_OFFLINE=1 forbids "
                              "the hub; point it at a local copy")
    if cfg.method.length_cache is not None and not Path(cfg.method.length_cache).exists():
        raise ConfigError(f"method.length_cache={cfg.method.length_cache} does not exist; build "
                          "it (python -m baselines.length_cache build ...) or leave it null to "
                          "build it in this run")
    oversize = cfg.method.odb.get("oversize", "singleton") if cfg.method.name == "odb" else ""
    if oversize == "error" and cfg.data.cutoff_len > cfg.method.token_budget:
        raise ConfigError(
            f"method.odb.oversize=error with data.cutoff_len={cfg.data.cutoff_len} > "
            f"method.token_budget={cfg.method.token_budget}: a sample up to the cutoff would "
            "stop the run mid-epoch. Raise the budget to >= the cutoff, lower the cutoff, or "
            "use oversize=singleton")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    clock = StartupClock()
    args = parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    preflight(cfg)
    check_machine(cfg.strategy.device, cfg.model.attn_implementation)
    out_dir = Path(cfg.run.out_dir)
    resume_from, note = resolve_resume(args.resume, out_dir, cfg)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    clock.mark("config")
    own_group = not dist.is_initialized()
    d = init_distributed(cfg)
    clock.mark("process group")
    setup_logging(d.rank)
    if note:
        log.warning(note)
    out_dir.mkdir(parents=True, exist_ok=True)
    if resume_from is None and d.rank == 0:
        _clear_previous_run(out_dir)
    torch.manual_seed(cfg.run.seed + d.rank)
    try:
        return _train(cfg, d, out_dir, resume_from, started, clock)
    finally:
        if own_group:
            dist.destroy_process_group()


def _clear_previous_run(out_dir: Path) -> None:
    """A fresh run's folder holds no earlier run's checkpoints or training curves."""
    for name in ("checkpoints", CURVES_DIR):
        if (out_dir / name).exists():
            log.info("fresh run: removing %s", out_dir / name)
            shutil.rmtree(out_dir / name)


def _train(cfg: TrainConfig, d: Dist, out_dir: Path, resume_from: Path | None,
           started: str, clock: StartupClock) -> dict[str, Any] | None:
    dist.barrier()  # rank 0 has cleared stale checkpoints of a fresh run
    clock.mark("barrier")
    train_set, val_set = build_datasets(cfg)
    clock.mark("datasets")
    loader, cache_info = build_method_loader(cfg, train_set, d.rank, out_dir)
    clock.mark("loader")
    model = build_trainable_model(cfg, train_set.tokenizer, d.device, resume_from)
    params = parameter_counts(model)
    clock.mark("model")
    strategy = make_strategy(model, cfg.strategy, cfg.optim, cfg.model.dtype == "bfloat16",
                             d.device)
    clock.mark("strategy")
    counters, fraction = Counters(), 0.0
    if resume_from is not None:
        counters, fraction = restore(resume_from, d, strategy, loader, cfg, out_dir)
        clock.mark("resume")
    log.info(clock.summary())
    log.info("%s | %s | %s %s | %s | W=%d | %d of %d parameters trainable", cfg.run.name,
             cfg.method.name, cfg.model.name, cfg.mode, cfg.strategy.name, d.world_size,
             params["trainable"], params["total"])
    checkpoint = Checkpointer(cfg, d.rank, out_dir, strategy, loader, train_set)
    counters, schedule = _run_loop(cfg, d, out_dir, resume_from is not None, TrainLoop(
        strategy=strategy, loader=loader, dataset=train_set, optim=cfg.optim,
        counters=counters, fraction=fraction, epochs=cfg.optim.epochs,
        max_steps=cfg.optim.max_steps, log_every=cfg.run.log_every,
        save_every=cfg.run.save_every, save=checkpoint.save))
    _sum_rank_counters(counters, d.device)
    save_final(out_dir / "final", d.rank, strategy, trainer_state(cfg, counters, schedule),
                checkpoint.processor_files)
    validation = _validate(cfg, model, val_set, d.device)
    if d.rank != 0:
        return None
    result = build_result(
        cfg=cfg, counters=counters, world_size=d.world_size,
        nodes=d.nodes, params=params, memory=peak_memory(), validation=validation,
        length_cache=cache_info, loader_stats=loader.stats(),
        tensorboard=str(out_dir / CURVES_DIR), started=started,
        finished=datetime.now(UTC).isoformat(timespec="seconds"))
    validate_result(result)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    log.info("done: %d samples in %.1f s = %.2f samples/s (padding efficiency %.3f); %s",
             result["emitted_samples"], result["train_wall_s"],
             result["throughput_samples_per_s"], result["padding_efficiency"],
             out_dir / "result.json")
    return result


def _run_loop(cfg: TrainConfig, d: Dist, out_dir: Path, resumed: bool,
              loop: TrainLoop) -> tuple[Counters, dict[str, float]]:
    """Run ``loop`` with its sample log, progress bar and (rank 0) training curves open,
    closed on every way out; (counters, schedule state)."""
    with contextlib.ExitStack() as stack:
        if cfg.run.record_sample_ids:
            # a resumed run appends to the log its checkpoint trimmed; a fresh one starts it
            path = out_dir / f"samples_rank{d.rank}.jsonl"
            loop.sample_log = stack.enter_context(path.open("a" if resumed else "w"))
        loop.bar = _progress_bar(d.rank, loop.loader)
        if loop.bar is not None:
            stack.callback(loop.bar.close)
        if d.rank == 0:
            # a resumed run's points replace those its interrupted segment wrote past the
            # checkpoint
            loop.curves = stack.enter_context(
                Curves(out_dir / CURVES_DIR, first_step=loop.c.optimizer_steps + 1))
        return loop.run(), loop.schedule_state()


def _sum_rank_counters(counters: Counters, device: torch.device) -> None:
    """Per-rank counters summed once at the end: tokens, and IDLE steps as rank-steps."""
    totals = torch.tensor([counters.real_tokens, counters.padded_tokens, counters.idle_steps],
                          dtype=torch.int64, device=device)
    dist.all_reduce(totals)
    counters.real_tokens, counters.padded_tokens, counters.idle_steps = (
        int(v) for v in totals.tolist())


def _validate(cfg: TrainConfig, model: torch.nn.Module, val_set: Any,
              device: torch.device) -> dict[str, Any] | None:
    if val_set is None:
        return None
    model.eval()
    out = validation_loss(model, val_set, token_budget=cfg.validation.token_budget
                          or cfg.method.token_budget, pad_token_id=val_set.tokenizer.pad_token_id,
                          device=device)
    model.train()
    return out


def _progress_bar(rank: int, loader: Any):
    if rank != 0:
        return None
    from tqdm import tqdm

    estimate = getattr(loader, "estimate_steps", lambda: None)()
    # disable=None: a bar on a terminal; in log files the log lines show progress
    return tqdm(total=estimate, unit="step", desc="train", mininterval=2.0, disable=None)
