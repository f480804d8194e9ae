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
import dataclasses
import glob
import json
import logging
import os
import shutil
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

import odb
from baselines import LengthCache, PackCollate, build_loader, needs_lengths
from baselines.length_cache import build as build_length_cache
from experiments.data.pipeline import PreprocessedDataset, collate
from experiments.train import checkpoint as ckpt
from experiments.train.config import TrainConfig
from experiments.train.config_build import ConfigError
from experiments.train.config_files import load_config
from experiments.train.curves import CURVES_DIR, Curves
from experiments.train.hardware import check_machine
from experiments.train.loop import Counters, TrainLoop
from experiments.train.model import apply_lora, build_model, parameter_counts, set_trainable
from experiments.train.result import build_result, peak_memory, validate_result
from experiments.train.strategy import Strategy, make_strategy
from experiments.train.validation import validation_loss

log = logging.getLogger("experiments.train")


@dataclasses.dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    nodes: int
    device: torch.device


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


# ---------------------------------------------------------------- distributed


def init_distributed(cfg: TrainConfig) -> Dist:
    """Join torchrun's process group, or make a one-process group for a plain launch.

    A caller that already joined a default group (a launcher of its own, a notebook, the
    test harness's warm ranks) trains in that group, which stays the caller's to end;
    LOCAL_RANK and LOCAL_WORLD_SIZE come from the environment (one node when unset).
    """
    joined = dist.is_initialized()
    if not joined and "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    backend = cfg.strategy.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if joined else 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not joined:
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.strategy.timeout_s))
    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Dist(dist.get_rank(), world, local_rank, max(1, world // per_node), device)


class StartupClock:
    """Seconds spent in each start-up phase, from the process's own start.

    The first phase is the launch and the imports (process creation to :func:`main`);
    each :meth:`mark` closes the phase since the previous one. :meth:`summary` is the
    one log line a slow start is read from (a Slurm job's or a test's stderr).
    """

    def __init__(self) -> None:
        launched = time.time() - psutil.Process().create_time()
        self.phases: dict[str, float] = {"launch and imports": max(0.0, launched)}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = now - self._last
        self._last = now

    def summary(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in self.phases.items())
        return f"start-up {total:.1f} s: {parts}"


def _setup_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(message)s", stream=sys.stderr)


# ---------------------------------------------------------------- data and loader


def build_datasets(cfg: TrainConfig) -> tuple[PreprocessedDataset, PreprocessedDataset | None]:
    train = PreprocessedDataset(cfg.data)
    val = None
    if cfg.validation.enabled:
        val = PreprocessedDataset(dataclasses.replace(cfg.data, holdout=True))
    return train, val


def _length_cache(cfg: TrainConfig, dataset: PreprocessedDataset, rank: int, out_dir: Path,
                  workers: int) -> tuple[LengthCache, dict[str, Any]]:
    """Load the configured cache, or build one in this run (rank 0, timed)."""
    built = cfg.method.length_cache is None
    path = out_dir / "length_cache.json" if built else Path(cfg.method.length_cache)
    if built and rank == 0:
        log.info("building the length cache (one full preprocessing pass)")
        build_length_cache(dataset, num_workers=workers, command="built by experiments.train"
                           ).save(path)
    dist.barrier()
    cache = LengthCache.load(path, dataset)  # refuses a stale fingerprint
    return cache, {"path": str(path), "build_seconds": cache.build_seconds,
                   "build_timings": list(cache.build_timings), "built_in_run": built}


def build_method_loader(cfg: TrainConfig, dataset: PreprocessedDataset, rank: int,
                        out_dir: Path) -> tuple[Any, dict[str, Any] | None]:
    """The loader of ``cfg.method`` with this run's seed, accumulation and collate."""
    options = cfg.method.loader_options(cfg.optim.grad_accum_steps, cfg.run.seed,
                                        cfg.data.cutoff_len)
    if cfg.method.name == "packing":
        dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        collate_fn = PackCollate(mask_dtype=dtype,
                                 block_mask=cfg.model.attn_implementation != "flash_attention_2")
    else:
        collate_fn = partial(collate, pad_token_id=dataset.tokenizer.pad_token_id)
    lengths, cache_info = None, None
    if needs_lengths(cfg.method.name):
        lengths, cache_info = _length_cache(cfg, dataset, rank, out_dir, cfg.method.num_workers)
    loader = build_loader(cfg.method.name, dataset, cfg.method.token_budget,
                          collate_fn=collate_fn, lengths=lengths, **options)
    if isinstance(loader, odb.ODBLoader):
        loader.start()  # its collate process starts up while the model is built
    return loader, cache_info


# ---------------------------------------------------------------- model


def build_trainable_model(cfg: TrainConfig, tokenizer, device: torch.device,
                          resume_from: Path | None):
    """The model to train; under DDP a resumed run starts from the checkpoint's weights."""
    model_cfg = cfg.model
    if resume_from is not None and cfg.mode == "full" and cfg.strategy.name == "ddp":
        model_cfg = dataclasses.replace(model_cfg, init="pretrained",
                                        path=str(resume_from / "model"))
    model = build_model(model_cfg, tokenizer, cfg.run.seed, device)
    if cfg.mode == "full":
        set_trainable(model, cfg.model.train_vision)
        return model
    model.requires_grad_(False)
    model = apply_lora(model, cfg.lora, cfg.model.train_vision)
    if resume_from is not None and cfg.strategy.name == "ddp":
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(model, load_peft_weights(str(resume_from / "adapter")))
    return model


# ---------------------------------------------------------------- resume


def resolve_resume(option: str, out_dir: Path, cfg: TrainConfig) -> tuple[Path | None, str]:
    """(The checkpoint to continue from or None for a fresh run, a note to log).

    ``auto`` resumes the newest complete checkpoint when it was made with the same
    grouping-relevant settings, and otherwise starts fresh with a note (a workflow rerun
    after a config change); an explicit folder that does not match is an error.
    """
    if option == "none":
        return None, ""
    if option == "auto":
        folder = ckpt.find_latest(out_dir)
        if folder is None:
            return None, f"--resume auto: no complete checkpoint under {out_dir}; fresh start"
        try:
            check_resumable(ckpt.read_state(folder)["config"], cfg, folder)
        except ConfigError as exc:
            return None, f"{exc}. --resume auto starts fresh instead (old checkpoints removed)"
        return folder, ""
    folder = Path(option)
    if not (folder / ckpt.COMPLETE).exists():
        raise ConfigError(f"--resume {option}: not a complete checkpoint folder (no "
                          f"{ckpt.COMPLETE} marker); use --resume auto")
    check_resumable(ckpt.read_state(folder)["config"], cfg, folder)
    return folder, ""


def check_resumable(saved: dict[str, Any], cfg: TrainConfig, folder: Path) -> None:
    """What decides the samples and their grouping must match; workers, logging may change."""
    now = cfg.to_dict()
    if "optim" not in saved and "train" in saved:  # saved before the section was renamed
        saved = {**saved, "optim": saved["train"]}
    for key in ("data", "method.name", "method.token_budget", "method.odb", "method.baseline",
                "optim.grad_accum_steps", "run.seed"):
        section, _, name = key.partition(".")
        old, new = saved[section], now[section]
        if name:
            old, new = old.get(name), new.get(name)
        if old != new:
            raise ConfigError(f"--resume: the checkpoint {folder} was made with {key}={old!r}, "
                              f"this run has {new!r}; resume with the same setting")


def _trim_sample_log(path: Path, steps: int) -> None:
    """Drop the rows of steps after the checkpoint (they will be run again)."""
    if path.exists():
        rows = [line for line in path.read_text().splitlines()
                if json.loads(line)["step"] <= steps]
        path.write_text("".join(r + "\n" for r in rows))


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
    _setup_logging(d.rank)
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
        counters, fraction = _restore(resume_from, d, strategy, loader, cfg, out_dir)
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
    _save_final(out_dir / "final", d.rank, strategy, _state(cfg, counters, schedule),
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


class Checkpointer:
    """Writes this run's checkpoints (collective) and keeps the newest ``keep_checkpoints``."""

    def __init__(self, cfg: TrainConfig, rank: int, out_dir: Path, strategy: Strategy,
                 loader: Any, train_set: PreprocessedDataset) -> None:
        self.cfg, self.rank, self.out_dir = cfg, rank, out_dir
        self.strategy, self.loader = strategy, loader
        self.processor_files = [train_set.tokenizer, train_set.image_processor]

    def save(self, counters: Counters, schedule: dict[str, float]) -> None:
        folder = self.out_dir / "checkpoints" / f"step_{counters.optimizer_steps:06d}"
        ckpt.save_checkpoint(folder, rank=self.rank, strategy=self.strategy, loader=self.loader,
                             trainer_state=_state(self.cfg, counters, schedule),
                             local=counters.local(), processor_files=self.processor_files)
        if self.rank == 0:
            ckpt.prune(self.out_dir, self.cfg.run.keep_checkpoints)


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


def _state(cfg: TrainConfig, counters: Counters, schedule: dict[str, float]) -> dict[str, Any]:
    return {"run_id": cfg.run.name, "global_step": counters.optimizer_steps,
            "counters": counters.to_dict(), "schedule": schedule, "config": cfg.to_dict()}


def _restore(folder: Path, d: Dist, strategy: Strategy, loader: Any, cfg: TrainConfig,
             out_dir: Path) -> tuple[Counters, float]:
    """Load the checkpoint into the strategy and the loader; (counters, progress reached)."""
    state = ckpt.read_state(folder)
    strategy.load(folder)  # DDP: the optimizer (weights came with the model); else both
    loader.load_state_dict(ckpt.load_pieces(folder))  # every saved rank's piece, merged
    counters = Counters(**state["counters"]).with_local(ckpt.load_rank_state(folder, d.rank))
    # A checkpoint on an epoch's short last window holds a loader whose epoch is done
    # (taking the window met the epoch's end): the loader then stands at the next epoch.
    counters.epoch = loader.epoch
    if cfg.run.record_sample_ids:
        _trim_sample_log(out_dir / f"samples_rank{d.rank}.jsonl", counters.loader_steps)
    log.info("resumed from %s (optimizer step %d, epoch %d)", folder,
             counters.optimizer_steps, counters.epoch)
    return counters, float(state["schedule"]["fraction"])


def _save_final(folder: Path, rank: int, strategy: Strategy, state: dict[str, Any],
                processor_files: list[Any]) -> None:
    whole = strategy.full_state_dict()  # collective under FSDP
    if rank == 0:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        ckpt.write_model(folder, strategy.model, processor_files, whole)
        (folder / ckpt.STATE_FILE).write_text(json.dumps(state, indent=1))
    dist.barrier()


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
