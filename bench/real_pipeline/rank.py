"""What one rank of a (proxy, W, loader) cell runs: its loader over the real pipeline,
timed per epoch, with a consumer that counts (and optionally holds the GIL)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.real_pipeline.memory import own_uss_mb

LOADERS = ("plain", "odb", "odb-thread")
# What each odb variant sets on top of --odb.
VARIANTS = {"odb": {}, "odb-thread": {"collate_mode": "thread"}}
MB = 1 << 20
# Nothing on this path may reach a hub; set in every rank before HF code is imported.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class CellSpec:
    """What one rank of one (proxy, W, loader) cell runs; picklable for the spawn."""

    proxy: str
    source: str
    processor: str
    loader: str
    samples: int
    budget: int
    workers: int
    epochs: int
    max_pixels: int
    cutoff_len: int
    seed: int
    progress_s: float
    odb_options: tuple[tuple[str, Any], ...] = ()
    consumer_us_per_token: float = 0.0
    pixels: str = "uint8"


def proxy_source(root: Path, name: str) -> str:
    """The ``DataConfig.source`` of a proxy written by ``experiments.data.proxies``."""
    return str(root / name / "llava_instruct_150k.json") if name == "llava" else str(root / name)


def _build_loader(spec: CellSpec, dataset: Any, rank: int, world: int) -> tuple[Any, Any]:
    """(loader, the object whose ``set_epoch`` selects the epoch's order)."""
    from torch.utils.data import DataLoader, DistributedSampler

    import odb
    from experiments.data.pipeline import collate

    collate_fn = partial(collate, pad_token_id=dataset.tokenizer.pad_token_id)
    if spec.loader in VARIANTS:
        loader = odb.ODBLoader(
            dataset,
            token_budget=spec.budget,
            num_workers=spec.workers,
            collate_fn=collate_fn,
            seed=spec.seed,
            **(dict(spec.odb_options) | VARIANTS[spec.loader]),
        )
        return loader, loader
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=sampler,
        num_workers=spec.workers,
        collate_fn=collate_fn,
    )
    return loader, sampler


def _run_epoch(spec: CellSpec, loader: Any, label: str) -> dict[str, Any]:
    import odb

    started = time.perf_counter()
    first_s = None
    samples = steps = idle = real = padded = 0
    next_report = started + spec.progress_s
    for batch in loader:
        now = time.perf_counter()
        if first_s is None:
            first_s = now - started
        if spec.loader in VARIANTS:
            info = odb.pop_step_info(batch)
            n, is_idle = info.local_samples, info.idle
        else:
            n, is_idle = batch["input_ids"].shape[0], False
        steps += 1
        samples += n
        if is_idle:
            idle += 1
        else:
            mask = batch["attention_mask"]
            tokens = int(mask.sum())
            real += tokens
            padded += mask.numel()
            _busy(tokens * spec.consumer_us_per_token * 1e-6)
        del batch
        if now >= next_report:
            _rank_progress(label, samples, steps, now - started, first_s)
            next_report = now + spec.progress_s
    wall = time.perf_counter() - started
    _rank_progress(label + " done", samples, steps, wall, first_s)
    return {
        "samples": samples,
        "steps": steps,
        "idle_steps": idle,
        "wall_s": round(wall, 3),
        "first_batch_s": None if first_s is None else round(first_s, 3),
        "real_tokens": real,
        "padded_tokens": padded,
    }


def _busy(seconds: float) -> None:
    """Hold the GIL in pure Python for ``seconds``: a stand-in for a trainer's own work.

    Not a model of GPU training (a CUDA step mostly waits with the GIL released): the
    worst case for a collate thread that shares the trainer's interpreter.
    """
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _rank_progress(label: str, samples: int, steps: int, elapsed: float, first: float | None):
    first_txt = "no batch yet" if first is None else f"first batch {first:.2f} s"
    rate = samples / elapsed if elapsed > 0 else 0.0
    print(
        f"  [{label}] {samples} samples, {steps} steps in {elapsed:.1f} s: "
        f"{rate:.1f} samples/s ({first_txt})",
        file=sys.stderr,
        flush=True,
    )


def rank_cell(rank: int, world: int, spec: CellSpec) -> dict[str, Any]:
    """One rank of a cell: build the dataset and loader, run the epochs, measure."""
    import multiprocessing

    from experiments.data.pipeline import PreprocessedDataset
    from experiments.data.records import DataConfig

    # A rank started by multiprocessing's spawn inherits "spawn" as its default start
    # method, so a plain DataLoader's workers would re-import torch and unpickle the
    # dataset (25-35 s to the first batch on a loaded 2-core machine). A rank started
    # by torchrun has the platform default (fork on Linux); give the rank that.
    multiprocessing.set_start_method(None, force=True)

    dataset = PreprocessedDataset(
        DataConfig(
            spec.proxy,
            spec.source,
            spec.processor,
            cutoff_len=spec.cutoff_len,
            image_max_pixels=spec.max_pixels,
            seed=spec.seed,
            max_samples=spec.samples,
            pixels=spec.pixels,
        )
    )
    if len(dataset) != spec.samples:
        raise ValueError(
            f"{spec.proxy} at {spec.source} has {len(dataset)} records, fewer than "
            f"--samples {spec.samples}; lower --samples or generate more rows"
        )
    loader, epoch_setter = _build_loader(spec, dataset, rank, world)
    uss_before = own_uss_mb()
    epochs = []
    for epoch in range(spec.epochs):
        epoch_setter.set_epoch(epoch)
        label = f"{spec.proxy} W={world} {spec.loader} rank {rank} epoch {epoch}"
        record = _run_epoch(spec, loader, label)
        if spec.loader in VARIANTS:
            record["odb_stats"] = loader.stats()
        epochs.append(record)
    return {"rank": rank, "uss_before_iter_mb": uss_before, "epochs": epochs}
