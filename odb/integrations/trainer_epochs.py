"""The loader's epochs as a ``transformers.Trainer`` iterates them (``ODBTrainerMixin``):
counted by the loader, sized by an upper bound, and the run's step total as it becomes
known (:meth:`LoaderEpochs.total_steps`, the progress bar's total)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

__all__ = ["LoaderEpochs"]


class LoaderEpochs:
    """What the Trainer iterates: the loader's epochs, counted by the loader, not the Trainer.

    Each ``iter()`` runs the loader's next epoch (the restored one after a resume); an
    epoch that yields nothing (restored after its last step) hands over to the next, so
    the Trainer never sees an empty epoch while epochs remain. ``len()`` exists only
    when epochs are counted (no ``max_steps``): an upper bound of steps per epoch, which
    only sizes the Trainer's loop.
    """

    def __init__(self, loader: Any, epochs: int | None, world_size: int) -> None:
        self.loader, self.epochs = loader, epochs
        self.dataset = loader.dataset
        self._world_size = world_size
        self._running = False
        self.restart()

    def restart(self) -> None:
        """Continue from the loader's epoch (after a load)."""
        self.epoch, self._running = self.loader.epoch, False

    def __len__(self) -> int:
        if self.epochs is None:
            raise TypeError("with max_steps the Trainer runs without an epoch length")
        # Every step holds a sample on some rank and an epoch reads each sample once
        # (per-rank datasets: once per rank; non-join: plus a carry of less than an
        # epoch), so this bounds the steps; the window padding adds less than a window.
        cfg = self.loader.config
        per_rank = getattr(self.loader, "shard", "rank") != "odb"
        samples = len(self.dataset) * (self._world_size if per_rank else 1)
        bound = samples * (1 if cfg.join else 2) + cfg.grad_accum_steps
        return math.ceil(bound / cfg.grad_accum_steps) * cfg.grad_accum_steps

    def fraction(self) -> float:
        """Fraction of training done: ``(epochs done + loader.progress()) / epochs``."""
        if self.epochs is None:
            return 0.0
        current = self.loader.progress() if self._running else 0.0
        return min((self.epoch + current) / self.epochs, 1.0)

    def total_steps(self, done: int) -> int | None:
        """The run's optimizer steps as known after ``done`` of them; None without epochs.

        ``done`` once the last epoch's data has ended. Before that, ``done`` plus an
        estimate of the rest: the loader's step estimate for an epoch
        (``estimate_steps()``, in batches, over the accumulation steps), its unread
        fraction for the running epoch and whole ones for the epochs to come; at least
        ``done + 1``, so the Trainer's ``global_step >= max_steps`` stop cannot end an
        epoch the loader has not finished. Before any estimate, None.
        """
        if self.epochs is None:
            return None
        if self.epoch >= self.epochs and not self._running:
            return done
        batches = self.loader.estimate_steps()
        if batches is None:
            return None
        per_epoch = math.ceil(batches / self.loader.config.grad_accum_steps)
        left = self.epochs - self.epoch
        rest = 0
        if self._running:
            left -= 1
            rest = math.ceil(per_epoch * (1.0 - self.loader.progress()))
        return max(done + rest + left * per_epoch, done + 1)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.epochs is None or self.epoch < self.epochs:
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(self.epoch)  # e.g. seeded augmentation
            self.loader.set_epoch(self.epoch)
            yielded = False
            self._running = True
            for batch in self.loader:
                yielded = True
                yield batch
            self._running = False
            self.epoch += 1
            if yielded:
                return
