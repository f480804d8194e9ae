"""The run's parts, built from its config: datasets, the method's loader, the model to train.

A method that plans from lengths gets its length cache here: the configured one (its
fingerprint checked) or one built in this run by rank 0 and timed.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import odb
from baselines import LengthCache, PackCollate, build_loader, needs_lengths
from baselines.length_cache import build as build_length_cache
from experiments.data.pipeline import PreprocessedDataset, collate
from experiments.train.config import TrainConfig
from experiments.train.model import apply_lora, build_model, set_trainable

log = logging.getLogger("experiments.train")


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
