"""The recipe's learning-rate shape, driven by training progress, not by a step count.

With dynamic batching the number of steps in an epoch is only known at its end, so a
step-indexed scheduler (``get_cosine_schedule_with_warmup(total_steps)``) would end too
early or too late. The rate is a function of the *fraction of training done*,
``(epoch + window.progress) / epochs``, which every loader reports exactly; the loop
steps :class:`odb.integrations.ProgressLR` before each window, so the first window sees
0 and after the last sample of the last epoch the fraction stands at exactly 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from experiments.train.config import OptimConfig
from odb.integrations import ProgressLR

__all__ = ["build_scheduler", "lr_factor"]


def lr_factor(fraction: float, kind: str, warmup: float, min_ratio: float) -> float:
    """The learning rate over its peak at ``fraction`` of training (0..1).

    Linear warm-up from 0 over ``warmup``, then ``cosine`` or ``linear`` decay to
    ``min_ratio`` at 1.0, or ``constant``.

    Example:
        >>> lr_factor(0.0, "cosine", 0.1, 0.0), lr_factor(0.1, "cosine", 0.1, 0.0)
        (0.0, 1.0)
        >>> round(lr_factor(0.55, "cosine", 0.1, 0.0), 6), lr_factor(1.0, "cosine", 0.1, 0.0)
        (0.5, 0.0)
    """
    fraction = min(max(fraction, 0.0), 1.0)
    if warmup > 0 and fraction < warmup:
        return fraction / warmup
    if kind == "constant":
        return 1.0
    decay = (fraction - warmup) / (1.0 - warmup)
    shape = 0.5 * (1.0 + math.cos(math.pi * decay)) if kind == "cosine" else 1.0 - decay
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    progress: Callable[[], float]) -> ProgressLR:
    """``cfg``'s schedule over ``optimizer`` (created with ``lr=cfg.lr``), at ``progress()``."""
    shape = partial(lr_factor, kind=cfg.schedule, warmup=cfg.warmup_ratio,
                    min_ratio=cfg.min_lr_ratio)
    return ProgressLR(optimizer, shape, progress=progress)
