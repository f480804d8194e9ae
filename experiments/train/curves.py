"""Training curves: TensorBoard scalars, one point per optimizer step, written by rank 0.

The training loop already turns each optimizer step into global figures when it
all-reduces the steps' loss sums (every ``run.log_every`` steps, with their token and
IDLE counts in the same collective). It hands each step over as a :class:`StepPoint`,
and :class:`Curves` writes it to TensorBoard event files in ``<out_dir>/tensorboard/``
(:data:`CURVES_DIR`), the format HF's Trainer and Lightning write:
``tensorboard --logdir results/train`` shows every run of the workflow side by side.

The scalars, at the optimizer step's number (1-based, as in the result's loss curve):

* ``train/loss``: the window's global per-token mean loss (the result's ``loss_curve``).
* ``train/lr``: the learning rate the window trained with.
* ``train/tokens_per_s``: the window's real (unpadded) tokens over all ranks, over rank
  0's wall time of the step (its wait for the window's batches, the micro-steps and the
  optimizer step; the ranks move in lockstep, so one clock stands for all).
* ``train/padding_efficiency``: the window's real over padded tokens, all ranks.
* ``train/idle_steps``: IDLE micro-steps in the window, summed over the ranks (0: none).

A resumed run writes new event files into the same folder, from the step after its
checkpoint on: TensorBoard hides the points an interrupted segment wrote past that step
(``SummaryWriter``'s ``purge_step``), so every step keeps one point, the one the result
counts. Points are flushed to disk at every checkpoint and at :meth:`Curves.close`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["CURVES_DIR", "TAGS", "Curves", "StepPoint"]

CURVES_DIR = "tensorboard"  # the event folder, inside the run's out_dir
TAGS = ("train/loss", "train/lr", "train/tokens_per_s", "train/padding_efficiency",
        "train/idle_steps")


@dataclass(frozen=True)
class StepPoint:
    """One optimizer step's figures, over all ranks except the wall time.

    Attributes:
        step: Optimizer step (1-based).
        loss: Global per-token mean loss of the step's window.
        lr: Learning rate of the window.
        real_tokens: Unpadded tokens of the window, all ranks.
        padded_tokens: Tokens the window's batches occupy with padding, all ranks.
        idle_steps: IDLE micro-steps of the window, all ranks.
        wall_s: Rank 0's wall time of the step.

    Example:
        >>> StepPoint(step=1, loss=2.5, lr=1e-3, real_tokens=600, padded_tokens=800,
        ...           idle_steps=1, wall_s=2.0).scalars()["train/tokens_per_s"]
        300.0
    """

    step: int
    loss: float
    lr: float
    real_tokens: int
    padded_tokens: int
    idle_steps: int
    wall_s: float

    def scalars(self) -> dict[str, float]:
        """The step's value of each tag in :data:`TAGS`."""
        return {
            "train/loss": self.loss,
            "train/lr": self.lr,
            "train/tokens_per_s": self.real_tokens / max(self.wall_s, 1e-9),
            "train/padding_efficiency": self.real_tokens / max(self.padded_tokens, 1),
            "train/idle_steps": float(self.idle_steps),
        }


class Curves:
    """TensorBoard event files of one run segment; a context manager that closes them.

    Args:
        folder: The event folder (``<out_dir>/tensorboard``), created when missing.
        first_step: The first optimizer step this segment trains: 1 for a fresh run, the
            checkpoint's step + 1 for a resumed one. Points that earlier segments wrote
            from this step on are hidden.

    Example:
        >>> with Curves(tmp / CURVES_DIR) as curves:                  # doctest: +SKIP
        ...     curves.add(StepPoint(step=1, loss=2.5, lr=1e-3, real_tokens=600,
        ...                          padded_tokens=800, idle_steps=0, wall_s=2.0))
    """

    def __init__(self, folder: Path, *, first_step: int = 1) -> None:
        if first_step < 1:
            raise ValueError(f"first_step must be >= 1 (optimizer steps count from 1), "
                             f"got {first_step}")
        # Imported here: only rank 0 writes curves, and tensorboard is slow to import.
        from torch.utils.tensorboard import SummaryWriter

        self._writer: SummaryWriter | None = SummaryWriter(str(folder), purge_step=first_step)

    def add(self, point: StepPoint) -> None:
        """Write one point of each tag at ``point.step``."""
        if self._writer is None:
            raise RuntimeError("Curves.add after close(): the event files are closed")
        for tag, value in point.scalars().items():
            self._writer.add_scalar(tag, value, global_step=point.step)

    def flush(self) -> None:
        """Write the pending points to disk (before a checkpoint: a killed run keeps them)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event files and stop their writer thread; idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Curves:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
