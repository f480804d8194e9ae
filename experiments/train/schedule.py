"""Learning-rate schedule driven by training progress, not by a step count.

With dynamic batching the number of steps in an epoch is only known at its end, so a
step-indexed scheduler (``get_cosine_schedule_with_warmup(total_steps)``) would end too
early or too late. This schedule is a function of the *fraction of training done*,
``(epoch + loader.progress()) / epochs``, which every loader reports exactly; an
optimizer step uses the fraction reached before its window, so the first step sees 0
and after the last sample of the last epoch the schedule stands at exactly 1.0.

Pure: no torch import beyond the optimizer it sets.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ProgressSchedule", "lr_factor"]


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


class ProgressSchedule:
    """Sets every param group's ``lr`` from the fraction of training done.

    Args:
        optimizer: Any object with ``param_groups`` (a torch optimizer).
        peak_lr: The learning rate after warm-up.
        kind: ``cosine``, ``linear`` or ``constant``.
        warmup: Fraction of training in warm-up.
        min_ratio: Final learning rate over ``peak_lr``.

    Example:
        >>> class Opt: param_groups = [{"lr": 0.0}]
        >>> schedule = ProgressSchedule(Opt(), 1e-3, "linear", 0.0, 0.0)
        >>> schedule.update(0.25)
        0.00075
    """

    def __init__(self, optimizer: Any, peak_lr: float, kind: str, warmup: float,
                 min_ratio: float) -> None:
        self.optimizer = optimizer
        self.peak_lr, self.kind, self.warmup, self.min_ratio = peak_lr, kind, warmup, min_ratio
        self.fraction = 0.0

    def update(self, fraction: float) -> float:
        """Move to ``fraction`` of training; returns the learning rate set."""
        if fraction < self.fraction - 1e-12:
            raise ValueError(f"training progress went backwards: {self.fraction} -> {fraction}")
        self.fraction = fraction
        lr = self.peak_lr * lr_factor(fraction, self.kind, self.warmup, self.min_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict[str, float]:
        return {"fraction": self.fraction}

    def load_state_dict(self, state: dict[str, float]) -> None:
        state = dict(state)
        self.update(float(state.pop("fraction")))
        if state:
            raise ValueError(f"unknown schedule state keys {sorted(state)}")
