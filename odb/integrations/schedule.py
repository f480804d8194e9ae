"""A learning-rate scheduler driven by training progress, for loaders without a length.

An ODB epoch's step count depends on the realised sample lengths, so a schedule written
as a function of the step (``lr(step / total_steps)``) has no ``total_steps`` to use.
:class:`ProgressLR` asks a callable for the fraction of training done instead, each time
it steps: the schedule then ends exactly when the data does, however many steps that
took, and calling ``step()`` more or fewer times (a wrapper that steps it once per
process, a resumed run) changes nothing. Torch-only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["ProgressLR"]


class ProgressLR(torch.optim.lr_scheduler.LRScheduler):
    """Sets each group's learning rate to ``base_lr * lr_lambda(progress())``.

    Args:
        optimizer: The wrapped optimizer.
        lr_lambda: Multiplier of the base learning rate as a function of the fraction of
            training done, in [0, 1] (one per parameter group, or one for all).
        progress: Returns the fraction of training done so far, in [0, 1]. Read at every
            ``step()``: after an optimizer step, it gives the rate of the next one.

    Example:
        >>> sched = ProgressLR(opt, lambda f: 1.0 - f,                       # doctest: +SKIP
        ...                    progress=lambda: (epoch + loader.progress()) / epochs)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_lambda: Callable[[float], float] | Sequence[Callable[[float], float]],
        progress: Callable[[], float],
    ) -> None:
        groups = len(optimizer.param_groups)
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * groups
        else:
            self.lr_lambdas = list(lr_lambda)
            if len(self.lr_lambdas) != groups:
                raise ValueError(
                    f"got {len(self.lr_lambdas)} lr_lambdas for {groups} parameter groups; "
                    "give one per group, or a single one"
                )
        self.progress = progress
        super().__init__(optimizer)

    def step(self, epoch: int | None = None) -> None:
        """Set every group's rate from ``progress()`` now.

        Any time and any number of times: before the first ``optimizer.step()`` too (the
        rate of the first window), so torch's warning about that order, which guards
        step-indexed schedules, does not apply.

        Raises:
            TypeError: ``epoch`` is given (the rate follows ``progress()``, not a count).
        """
        if epoch is not None:
            raise TypeError("ProgressLR.step() takes no epoch: the rate follows progress()")
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def fraction(self) -> float:
        """The progress clipped to [0, 1]."""
        return min(max(float(self.progress()), 0.0), 1.0)

    def get_lr(self) -> list[float | torch.Tensor]:
        fraction = self.fraction()
        return [
            base * lam(fraction) for lam, base in zip(self.lr_lambdas, self.base_lrs, strict=True)
        ]

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's counters; the callables are not saved (they are rebuilt)."""
        return {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("optimizer", "lr_lambdas", "progress")
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the counters; the rate follows from ``progress()`` at the next step."""
        self.__dict__.update(
            {
                k: v
                for k, v in state_dict.items()
                if k not in ("optimizer", "lr_lambdas", "progress")
            }
        )
