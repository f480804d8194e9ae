"""Fail fast on the wrong machine: before the model loads, a run whose config asks for
GPUs checks that it has them, and Packing on flash-attention checks for the package.

Without this a job that asked Slurm for GPUs and got none (a wrong ``gres``, a driver
the torch wheel does not match, an empty ``CUDA_VISIBLE_DEVICES``) trained on CPU over
Gloo until its time limit, and a Packing cell on a node without ``flash_attn`` failed
only after the model had loaded.
"""

from __future__ import annotations

import importlib
import os

import torch

__all__ = ["HardwareError", "check_machine"]


class HardwareError(RuntimeError):
    """This machine cannot run what the config asks for; the message says what to check."""


def check_machine(device: str, attn_implementation: str,
                  local_world_size: int | None = None) -> None:
    """Refuse, before any model loads, a run this machine cannot do as configured.

    Args:
        device: ``strategy.device``: ``cuda`` needs CUDA with a GPU per local rank;
            ``auto`` trains on whatever is there (CPU when no GPU is visible).
        attn_implementation: ``model.attn_implementation``; ``flash_attention_2``
            needs the ``flash_attn`` package.
        local_world_size: Ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``; read from
            the environment when not given, 1 for a plain launch).

    Raises:
        HardwareError: CUDA is not visible or has fewer devices than local ranks, or
            flash-attention is asked for and ``flash_attn`` does not import (not
            installed, or built for another torch or CUDA).
    """
    if device == "cuda":
        _check_gpus(local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if attn_implementation == "flash_attention_2":
        _check_flash_attn()


def _check_flash_attn() -> None:
    # Imported, not only found: a wheel built for another torch or CUDA is installed
    # but fails on import (an undefined symbol), which would surface after model load.
    try:
        importlib.import_module("flash_attn")
    except ImportError as err:
        raise HardwareError(
            "model.attn_implementation=flash_attention_2 needs the flash_attn package, which "
            f"does not import here ({err}). A GPU node without internet installs the wheel "
            "the stage target copied (stage.spec.wheels in config/paper.yaml; built for this "
            "environment's torch and CUDA): pip install --no-index "
            "<cache>/wheels/flash_attn-*.whl (docs/workflow.md); or set "
            "model.attn_implementation=sdpa") from err


def _check_gpus(local_ranks: int) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if not torch.cuda.is_available():
        raise HardwareError(
            f"strategy.device=cuda but torch sees no CUDA device (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda}; CUDA_VISIBLE_DEVICES={visible}). Check the "
            "job's GPU request (Slurm gres), the node's driver against the torch wheel, and "
            "CUDA_VISIBLE_DEVICES; set strategy.device=auto only to train on CPU on purpose")
    found = torch.cuda.device_count()
    if found < local_ranks:
        raise HardwareError(
            f"strategy.device=cuda with {local_ranks} ranks on this node but {found} visible "
            f"GPU(s) (CUDA_VISIBLE_DEVICES={visible}): ask for gpu:{local_ranks} per node (Slurm "
            "gres) or start fewer ranks per node (torchrun --nproc_per_node)")
