"""A run's checkpoints: written as it trains, the final save, and continuing from one.

``--resume auto`` continues from the newest complete checkpoint when it was made with the
same grouping-relevant settings; an explicit folder that does not match is an error. The
on-disk layout is `experiments.train.checkpoint`'s.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from experiments.data.pipeline import PreprocessedDataset
from experiments.train import checkpoint as ckpt
from experiments.train.config import TrainConfig
from experiments.train.config_build import ConfigError
from experiments.train.launch import Dist
from experiments.train.loop import Counters
from experiments.train.strategy import Strategy

log = logging.getLogger("experiments.train")


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


def restore(folder: Path, d: Dist, strategy: Strategy, loader: Any, cfg: TrainConfig,
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
                             trainer_state=trainer_state(self.cfg, counters, schedule),
                             local=counters.local(), processor_files=self.processor_files)
        if self.rank == 0:
            ckpt.prune(self.out_dir, self.cfg.run.keep_checkpoints)


def trainer_state(cfg: TrainConfig, counters: Counters,
                  schedule: dict[str, float]) -> dict[str, Any]:
    """The trainer's part of a checkpoint: step, counters, schedule state and the config."""
    return {"run_id": cfg.run.name, "global_step": counters.optimizer_steps,
            "counters": counters.to_dict(), "schedule": schedule, "config": cfg.to_dict()}


def save_final(folder: Path, rank: int, strategy: Strategy, state: dict[str, Any],
                processor_files: list[Any]) -> None:
    """The final weights and trainer state under ``folder`` (collective; rank 0 writes)."""
    whole = strategy.full_state_dict()  # collective under FSDP
    if rank == 0:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        ckpt.write_model(folder, strategy.model, processor_files, whole)
        (folder / ckpt.STATE_FILE).write_text(json.dumps(state, indent=1))
    dist.barrier()
