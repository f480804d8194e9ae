"""The result JSON every run writes, and its schema (``experiments/schemas/train_result.json``).

Throughput is literal, as in the paper: emitted training samples (all ranks, IDLE steps
excluded) over the wall-clock time of the training loop (every segment of a resumed
run; set-up, validation and saving excluded).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["SCHEMA_PATH", "build_result", "validate_result"]

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "train_result.json"
SCHEMA_ID = "odb-train-result/2"
_PACKAGES = ("torch", "transformers", "deepspeed", "peft", "numpy", "odb")


def git_commit() -> str:
    """The repository's HEAD commit (with ``-dirty`` when files changed), or ``unknown``."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty.strip() else "")


def versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def hardware() -> dict[str, Any]:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"machine": platform.machine(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "gpu": gpu,
            "gpus_per_node": torch.cuda.device_count() if gpu else 0}


def peak_memory() -> dict[str, int | None]:
    """Peak resident set size of this process and peak GPU memory allocated (bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"rss_bytes": rss, "gpu_bytes": gpu}


def build_result(*, cfg: Any, counters: Any, world_size: int,
                 nodes: int, params: dict[str, int], memory: dict[str, int | None],
                 validation: dict[str, Any] | None, length_cache: dict[str, Any] | None,
                 loader_stats: dict[str, Any], tensorboard: str, started: str,
                 finished: str) -> dict[str, Any]:
    """Assemble the result record of a finished run (rank 0).

    ``counters`` hold global values: tokens and ``idle_steps`` (rank-steps) already
    summed over the ranks. ``tensorboard`` is the folder of the run's training curves
    (`experiments.train.curves`).
    """
    wall = max(counters.train_wall_s, 1e-9)
    padded_tokens = counters.padded_tokens
    curve = counters.loss_curve
    return {
        "schema": SCHEMA_ID,
        "run_id": cfg.run.name,
        "scale": cfg.run.scale,
        "method": cfg.method.name,
        "dataset": cfg.data.dataset,
        "model": cfg.model.name,
        "mode": cfg.mode,
        "strategy": cfg.strategy.name,
        "world_size": world_size,
        "nodes": nodes,
        "token_budget": cfg.method.token_budget,
        "grad_accum_steps": cfg.optim.grad_accum_steps,
        "epochs": cfg.optim.epochs,
        "emitted_samples": counters.samples,
        "train_wall_s": round(counters.train_wall_s, 4),
        "checkpoints": counters.checkpoints,
        "checkpoint_s": round(counters.checkpoint_s, 4),
        "throughput_samples_per_s": counters.samples / wall,
        "real_tokens": counters.real_tokens,
        "padded_tokens": padded_tokens,
        "real_tokens_per_s": counters.real_tokens / wall,
        "padded_tokens_per_s": padded_tokens / wall,
        "padding_efficiency": counters.real_tokens / max(padded_tokens, 1),
        "steps": counters.loader_steps,
        "optimizer_steps": counters.optimizer_steps,
        "idle_steps": counters.idle_steps,
        "idle_fraction": counters.idle_steps / max(counters.loader_steps * world_size, 1),
        "data_wait_s": round(counters.data_wait_s, 4),
        "segments": counters.segments,
        "epoch_timings": counters.epoch_timings,
        "peak_memory": memory,
        "parameters": params,
        "loss_curve": curve,
        "final_train_loss": curve[-1]["loss"] if curve else None,
        "tensorboard": tensorboard,
        "validation": validation,
        "length_cache": length_cache,
        "loader_stats": loader_stats,
        "config": cfg.to_dict(),
        "git_commit": git_commit(),
        "versions": versions(),
        "hardware": hardware(),
        "started": started,
        "finished": finished,
    }


def validate_result(result: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` when ``result`` breaks the schema."""
    import jsonschema

    jsonschema.validate(result, json.loads(SCHEMA_PATH.read_text()))
