"""Scheduler progress of one loader: the exact fraction of the epoch, and its step estimate.

Fed by the loader with every batch's :class:`~odb.core.step_info.StepInfo` (whose counts the
collate sides sum over the ranks); pure, no I/O. The method and its measured error are
in ``docs/resume.md`` ("Scheduler progress").
"""

from __future__ import annotations

from odb.core.step_info import StepInfo


class EpochProgress:
    """What the training loop has received this epoch, over all ranks.

    Example:
        >>> progress = EpochProgress()
        >>> progress.begin(total=100, emitted=40)  # 40 consumed before a restore
        >>> progress.fraction()
        0.4
    """

    def __init__(self) -> None:
        self.steps = 0  # steps received this epoch (since the restore, after one)
        self.last_epoch_steps: int | None = None
        self._total = 0  # the loader's own count of the epoch's samples (0: unknown)
        self._emitted = 0
        self._real_tokens = 0
        self._last: StepInfo | None = None

    def begin(self, total: int, emitted: int = 0) -> None:
        """An epoch of ``total`` samples (0: unknown) starts, ``emitted`` already consumed."""
        self.steps, self._real_tokens, self._last = 0, 0, None
        self._total, self._emitted = total, emitted

    def record(self, info: StepInfo) -> None:
        """The training loop received the step ``info`` describes."""
        self.steps += 1
        self._real_tokens += info.global_real_tokens
        self._emitted += info.global_samples
        self._last = info

    def finish(self) -> None:
        """The epoch ended; its step count is the next epoch's first estimate."""
        self.last_epoch_steps = self.steps

    def total(self) -> int:
        """The epoch's samples over all ranks (with per-rank data, as the ranks reported)."""
        info = self._last
        return info.epoch_samples if info is not None and info.epoch_samples else self._total

    def fraction(self) -> float:
        """Samples received over the epoch's samples, capped at 1 (0 when unknown)."""
        total = self.total()
        return min(self._emitted / total, 1.0) if total else 0.0

    def estimate_steps(self) -> int | None:
        """``round(N * R / r / (t / k))``, never less than ``k`` (``ODBLoader.estimate_steps``)."""
        info = self._last
        if info is None or not info.epoch_read_samples or not self._real_tokens:
            return self.last_epoch_steps
        total_tokens = self.total() * info.epoch_read_tokens / info.epoch_read_samples
        return max(self.steps, round(total_tokens / (self._real_tokens / self.steps)))
