"""Checkpoints a run can resume from, and the exported model evaluation reads.

Layout of one checkpoint folder (``<out_dir>/checkpoints/step_000040/`` or ``final/``)::

    model/ or adapter/     save_pretrained of the full model, or of the LoRA adapter, with
                           the tokenizer and image processor beside it (what eval loads)
    trainer_state.json     run id, steps, epoch, counters, loss curve, schedule, config
    optimizer.pt           DDP: the optimizer state (replicated, written by rank 0)
    deepspeed/             DeepSpeed: its own collective checkpoint (partitioned states)
    fsdp/                  FSDP: torch.distributed.checkpoint of the sharded model and
                           optimizer (resumable at another world size)
    loader/rank{r}.pt      each rank's loader state piece
    ranks/rank{r}.pt       each rank's Python / numpy / torch RNG states and its own
                           counters (padded tokens, IDLE steps, data wait)
    COMPLETE               written last, after every rank finished: only folders with it
                           are resumed from, so a run killed mid-save resumes the one before

Every rank calls `save` at the same optimizer step (the loaders keep every rank on the
same step count), so the barrier inside is safe.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["COMPLETE", "find_latest", "load_pieces", "load_rank_state", "save_checkpoint",
           "write_model"]

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def write_model(folder: Path, model: torch.nn.Module, processor_files: list[Any],
                state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """``model/`` (full) or ``adapter/`` (peft) with the tokenizer and image processor.

    ``state_dict``: the whole model's state when ``model`` holds shards of it (FSDP:
    ``Strategy.full_state_dict``); None saves ``model.state_dict()``.
    """
    is_adapter = hasattr(model, "peft_config")
    target = folder / ("adapter" if is_adapter else "model")
    if state_dict is None:
        model.save_pretrained(target)
    else:
        model.save_pretrained(target, state_dict=state_dict)
    for item in processor_files:
        item.save_pretrained(target)
    return target


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def load_rank_state(folder: Path, rank: int) -> dict[str, Any]:
    """Restore this rank's RNG states; return its own counters.

    A rank new to the run (resumed at a larger world size) keeps its RNG and starts its
    counters at zero; the counters of ranks that are gone are not carried over.
    """
    path = folder / "ranks" / f"rank{rank}.pt"
    if not path.exists():
        return {}
    saved = torch.load(path, weights_only=False)
    state = saved["rng"]
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return saved["local"]


def save_checkpoint(folder: Path, *, rank: int, strategy: Any, loader: Any,
                    trainer_state: dict[str, Any], local: dict[str, Any],
                    processor_files: list[Any]) -> None:
    """Write one checkpoint; collective over the trainer's ranks.

    ``strategy`` (``experiments.train.strategy``) writes the model's and optimizer's
    state; ``trainer_state`` is rank 0's (global counters, schedule, config); ``local``
    holds each rank's own counters.
    """
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)  # a half-written folder from a killed run
    _barrier()
    for sub in ("loader", "ranks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "loader" / f"rank{rank}.pt").write_bytes(pickle.dumps(loader.state_dict()))
    torch.save({"rng": _rng_state(), "local": local}, folder / "ranks" / f"rank{rank}.pt")
    strategy.save(folder, rank)
    whole = strategy.full_state_dict()  # collective under FSDP
    if rank == 0:
        write_model(folder, strategy.model, processor_files, whole)
        (folder / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
    _barrier()
    if rank == 0:
        (folder / COMPLETE).write_text("")


def load_pieces(folder: Path) -> list[dict[str, Any]]:
    """Every saved rank's loader state piece, in rank order."""
    paths = sorted((folder / "loader").glob("rank*.pt"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise FileNotFoundError(f"no loader state in {folder / 'loader'}")
    return [pickle.loads(p.read_bytes()) for p in paths]


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE_FILE).read_text())


def find_latest(out_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir/checkpoints``, or None."""
    done = [p.parent for p in (out_dir / "checkpoints").glob(f"step_*/{COMPLETE}")]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def prune(out_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (rank 0 only)."""
    done = sorted((p.parent for p in (out_dir / "checkpoints").glob(f"step_*/{COMPLETE}")),
                  key=lambda p: int(p.name.split("_")[1]))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
