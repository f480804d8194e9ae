"""Loader metrics, one definition of each figure for ODB and the baselines.

:class:`StepMetrics` counts what one rank's steps of an epoch were (padding, budget
fill, IDLE steps, oversize samples, budget violations); every loader of this project
fills it the same way, so ``stats()`` means the same across methods. ODB's collate side
adds how alignment went (:class:`EpochMetrics`); each loader's trainer side adds how
long it waited for data. ``stats()`` returns one flat dict of plain numbers (JSON-ready).

The figures, per rank and epoch:

* ``real_tokens``: the samples' lengths, summed over real steps.
* ``padded_tokens``: what the steps' batches occupy under the budget's cost model,
  ``TokenBudget.cost``: ``max_len * n`` per step for a padded batch (the default), the
  summed lengths for a packed row. Taken from the samples' lengths, not from the
  collated tensors, so it is the same figure whichever collate runs.
* ``padding_efficiency = real_tokens / padded_tokens`` (1.0 before any real step).
* ``budget_fill``: mean ``cost / token_budget`` over real steps.
* ``oversize``: real steps of one sample over the budget (never dropped);
  ``budget_violations``: real steps of several samples over it (a plan made from
  lengths that differ from the realised ones), ``max_violation_fill`` the worst.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from odb.core.alignment import RankStatus
from odb.core.budget import GroupMeasure, TokenBudget

__all__ = ["EpochMetrics", "StepMetrics"]


@dataclass
class StepMetrics:
    """Per-epoch counters of one rank's steps; the figures are defined in the module doc.

    Example:
        >>> m = StepMetrics()
        >>> m.record_step(TokenBudget(16), GroupMeasure().plus(6).plus(4))
        >>> m.record_idle()
        >>> s = m.summary()
        >>> s["padded_tokens"], s["padding_efficiency"], s["idle_fraction"]
        (12, 0.8333333333333334, 0.5)
    """

    steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    fill_sum: float = 0.0
    max_group_size: int = 0
    oversize: int = 0
    budget_violations: int = 0
    max_violation_fill: float = 0.0

    def record_step(self, budget: TokenBudget, measure: GroupMeasure) -> None:
        """Count one real step of ``measure.n`` samples, priced by ``budget``."""
        fill = budget.fill(measure)
        self._count(measure.n, measure.sum_len, budget.cost(measure), fill)
        if budget.fits(measure):
            return
        if measure.n == 1:
            self.oversize += 1  # a lone sample over budget: a singleton, never dropped
        else:
            self.budget_violations += 1
            self.max_violation_fill = max(self.max_violation_fill, fill)

    def record_idle(self) -> None:
        """Count one IDLE step (no samples; every label masked)."""
        self.steps += 1
        self.idle_steps += 1

    def _count(self, n: int, real: int, padded: int, fill: float) -> None:
        self.steps += 1
        self.samples += n
        self.real_tokens += real
        self.padded_tokens += padded
        self.fill_sum += fill
        self.max_group_size = max(self.max_group_size, n)

    def summary(self) -> dict[str, float | int]:
        """Flat numbers: the counters and the derived ratios (``fill_sum`` folded in)."""
        out = {k: v for k, v in asdict(self).items() if k != "fill_sum"}
        real_steps = self.steps - self.idle_steps
        out["padding_efficiency"] = (
            self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0
        )
        out["budget_fill"] = self.fill_sum / real_steps if real_steps else 0.0
        out["idle_fraction"] = self.idle_steps / self.steps if self.steps else 0.0
        out["mean_group_size"] = self.samples / real_steps if real_steps else 0.0
        return out


@dataclass
class EpochMetrics(StepMetrics):
    """Per-epoch counters of one rank's ODB collate side: its steps and its rounds."""

    recirculated: int = 0
    max_age: int = 0
    rounds: int = 0
    align_seconds: float = 0.0
    align_bytes: int = 0
    tail_rounds: int = 0
    tail_start_buffered: int = 0
    # The epoch-start stall: seconds from the start of the collate side's epoch (before
    # the source check and the first read) to its first batch handed to the trainer.
    first_emit_s: float = 0.0
    # The most bytes of sample data (tensors, arrays) the grouping buffer held at once,
    # with the samples read ahead for later rounds and the batches the trainer had not
    # freed yet (what ``buffer_bytes`` caps).
    peak_buffer_bytes: int = 0
    # CPU seconds of the collate side in this epoch (receiving the workers' samples,
    # measuring, grouping, collating, handing over): the whole collate process in process
    # mode, the collate thread in thread mode; DataLoader workers are not counted.
    collate_cpu_s: float = 0.0
    # Samples read while waiting for the peers' statuses, for later rounds.
    read_ahead: int = 0

    def record_tail(self, statuses: Sequence[RankStatus], end: bool) -> None:
        """Count rounds after every rank has read its whole view (the termination tail).

        ``tail_start_buffered`` is the most samples any rank held when the tail began;
        the protocol bounds ``tail_rounds <= tail_start_buffered`` (docs/protocol.md).
        """
        if end or not all(s.read_done for s in statuses):
            return
        if self.tail_rounds == 0:
            self.tail_start_buffered = max(s.buffered for s in statuses)
        self.tail_rounds += 1

    def summary(self) -> dict[str, float | int]:
        out = super().summary()
        out["mean_round_ms"] = 1000 * self.align_seconds / self.rounds if self.rounds else 0.0
        return out
