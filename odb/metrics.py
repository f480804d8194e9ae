"""Loader metrics: what the collate side and the trainer side each measure.

The collate side counts what it formed and how alignment went (:class:`EpochMetrics`);
the trainer side adds how long it waited for data. ``ODBLoader.stats()`` merges both
into one flat dict of plain numbers (JSON-ready).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from odb.alignment import RankStatus


@dataclass
class EpochMetrics:
    """Per-epoch counters of one rank's collate side."""

    steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    fill_sum: float = 0.0
    max_group_size: int = 0
    recirculated: int = 0
    max_age: int = 0
    oversize: int = 0
    rounds: int = 0
    align_seconds: float = 0.0
    align_bytes: int = 0
    tail_rounds: int = 0
    tail_start_buffered: int = 0
    group_sizes: dict[int, int] = field(default_factory=dict)

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

    def record_group(self, lengths: list[int], fill: float) -> None:
        self.steps += 1
        self.samples += len(lengths)
        self.real_tokens += sum(lengths)
        self.padded_tokens += max(lengths) * len(lengths)
        self.fill_sum += fill
        self.max_group_size = max(self.max_group_size, len(lengths))
        self.group_sizes[len(lengths)] = self.group_sizes.get(len(lengths), 0) + 1

    def summary(self) -> dict[str, float | int]:
        """Flat numbers, including the derived ratios."""
        out = {k: v for k, v in asdict(self).items() if k not in ("group_sizes", "fill_sum")}
        real_steps = self.steps - self.idle_steps
        out["padding_efficiency"] = (
            self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0
        )
        out["budget_fill"] = self.fill_sum / real_steps if real_steps else 0.0
        out["idle_fraction"] = self.idle_steps / self.steps if self.steps else 0.0
        out["mean_group_size"] = self.samples / real_steps if real_steps else 0.0
        out["mean_round_ms"] = 1000 * self.align_seconds / self.rounds if self.rounds else 0.0
        return out
