"""The collate side's round loop: read, group, align, collate, hand over.

One call of :func:`run_epoch` is one rank's epoch. It is the same code in the collate
process and in thread mode; only ``emit`` (the queue to the trainer) and the sample
iterator differ. Each round:

1. read samples into the window until it holds enough work (or the view is read);
2. group the window and report a fixed-size status to the peers (one all-gather);
3. derive the round's plan (:func:`odb.alignment.plan_round`, identical on all ranks)
   and this rank's ``T`` steps: real groups, split groups or IDLE steps;
4. collate them, sum the per-step sample and loss-token counts over the ranks (one
   all-reduce), and release steps whose gradient-accumulation window is complete.

Errors name the sample index that caused them; nothing is silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from odb.alignment import RankStatus
from odb.budget import GroupMeasure, TokenBudget
from odb.comm import AlignmentGroup
from odb.config import ODBConfig
from odb.loss import WindowNormalizer, count_loss_tokens
from odb.metrics import EpochMetrics
from odb.rounds import RankRounds
from odb.sharding import check_meet
from odb.step_info import STEP_INFO_KEY, StepInfo

LengthFn = Callable[[Any], int]


class PeerFailedError(RuntimeError):
    """Another rank's collate side reported a failure; this rank stops too."""


@dataclass(frozen=True)
class SampleMeter:
    """Measures one sample and rejects what ODB cannot batch, naming the index."""

    config: ODBConfig
    length_fn: LengthFn | None = None
    patches_fn: LengthFn | None = None

    def __call__(self, index: int, sample: Any) -> tuple[int, int]:
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"sample {index} is a {type(sample).__name__}; ODB needs each "
                "dataset item to be a dict of fields (one sample, not a batch)"
            )
        length = self._length(index, sample)
        patches = int(self.patches_fn(sample)) if self.patches_fn is not None else 0
        if length <= 0:
            raise ValueError(
                f"sample {index} has length {length}; ODB refuses empty samples "
                "instead of dropping them silently. Filter them out of the dataset"
            )
        budget = self.config.budget
        if self.config.oversize == "error" and budget.is_oversize(length, patches):
            raise ValueError(
                f"sample {index} (length {length}, patches {patches}) exceeds "
                f"token_budget={budget.max_tokens} on its own; raise the budget, "
                "truncate the sample, or set oversize='singleton'"
            )
        return length, patches

    def _length(self, index: int, sample: Mapping[str, Any]) -> int:
        if self.length_fn is not None:
            return int(self.length_fn(sample))
        key = self.config.length_key
        if key not in sample:
            raise ValueError(
                f"sample {index} has no {key!r} (fields: {sorted(sample)}); pass "
                "length_fn or set length_key to the field that holds the tokens"
            )
        value = sample[key]
        return int(value.shape[-1]) if hasattr(value, "shape") else len(value)


@dataclass
class EpochJob:
    """Everything one rank's collate side needs for one epoch (picklable)."""

    config: ODBConfig
    epoch: int
    rank: int
    world_size: int
    view: list[int] | None
    skip: frozenset[int] = frozenset()
    carried: list[tuple[int, Any]] = field(default_factory=list)
    shard: str = "odb"
    # This rank's row of the epoch's cross-rank source check (odb.sharding.meet_row).
    meet: list[int] = field(default_factory=list)


@dataclass
class EpochResult:
    """What an epoch leaves behind: unread or unemitted indices (non-join) and metrics."""

    carry: list[int]
    metrics: dict[str, float | int]
    carried_samples: list[tuple[int, Any]] = field(default_factory=list)


def run_epoch(
    job: EpochJob,
    samples: Iterator[tuple[int, Any]],
    group: AlignmentGroup,
    collate_fn: Callable[[list[Any]], Any],
    meter: SampleMeter,
    idle_template: Callable[[], Any],
    emit: Callable[[Any], None],
    free_slots: Callable[[], int],
) -> EpochResult:
    """Run one rank's epoch; every rank emits the same number of steps.

    Args:
        job: Config, epoch, rank and this rank's view (indices in reading order; None
            for a stream), plus samples carried in from the last epoch (streams only).
        samples: ``(index, sample)`` pairs of the view, in view order.
        group: The alignment group of this iteration.
        collate_fn: Turns a list of samples into a dict batch.
        meter: Measures and validates samples.
        idle_template: Returns a sample to build IDLE batches from when this rank has
            read none this epoch.
        emit: Hands one finished batch (with its step info) to the trainer; may block.
        free_slots: Free places in the queue to the trainer.
    """
    cfg = job.config
    stream = job.view is None
    # Before any sample is read: every rank checks that the ranks agree on their source
    # (same sharding; with ODB dealing, the same dataset size and epoch order), so a
    # mismatch that would lose samples is an error on every rank, not a silent loss.
    rows = group.gather_meet(job.meet) if job.meet else []
    epoch_samples = check_meet(rows) if rows else None
    epoch_samples = epoch_samples if epoch_samples is not None else 0
    rounds = RankRounds(cfg, None if stream else len(job.view))
    windows = WindowNormalizer(cfg.grad_accum_steps, job.world_size)
    metrics = EpochMetrics()
    state = _RoundState(job, collate_fn, meter, idle_template, metrics)
    for index, sample in job.carried:  # a stream's carry from the last epoch comes first
        state.read(rounds, index, sample)
    while True:
        while rounds.wants_read():
            try:
                index, sample = next(samples)
            except StopIteration:
                rounds.mark_exhausted()
                break
            state.read(rounds, index, sample)
        status = rounds.status(free_slots())
        metrics.max_age = max(metrics.max_age, rounds.buffer.max_age)
        started = time.perf_counter()
        rows = group.gather_status(status.to_row())
        metrics.align_seconds += time.perf_counter() - started
        statuses = [RankStatus.from_row(r) for r in rows]
        outcome = rounds.decide(statuses)
        metrics.record_tail(statuses, outcome.plan.end)
        if outcome.plan.failed_ranks:
            raise PeerFailedError(
                f"ODB ranks {list(outcome.plan.failed_ranks)} failed; rank {job.rank} stops"
            )
        if outcome.plan.end:
            break
        batches = state.build(outcome.payloads, outcome.steps.idle)
        started = time.perf_counter()
        # Per step: samples, loss tokens, real tokens; per round: what was read so far.
        counts = [
            n
            for _, info, real in batches
            for n in (info.local_samples, info.local_loss_tokens, real)
        ]
        totals = group.sum_counts(counts + [rounds.read_count, state.read_tokens])
        metrics.align_seconds += time.perf_counter() - started
        metrics.rounds += 1
        read_samples, read_tokens = totals[-2:]
        for i, (batch, info, _) in enumerate(batches):
            info = replace(
                info,
                global_samples=totals[3 * i],
                global_loss_tokens=totals[3 * i + 1],
                global_real_tokens=totals[3 * i + 2],
                epoch_read_samples=read_samples,
                epoch_read_tokens=read_tokens,
                epoch_samples=epoch_samples,
            )
            for item, window_tokens, normalizer in windows.push(
                (batch, info), info.global_loss_tokens
            ):
                emit(_attach(item, window_tokens, normalizer))
    for item, window_tokens, normalizer in windows.flush():
        emit(_attach(item, window_tokens, normalizer))
    metrics.align_bytes = group.bytes_sent
    metrics.recirculated = rounds.recirculated
    leftover = rounds.leftover()
    if cfg.join:
        return EpochResult(carry=[], metrics=metrics.summary())
    if stream:  # a stream cannot be re-read by index: carry the samples themselves
        carried = [(index, sample) for index, sample, _ in leftover]
        return EpochResult(
            carry=[i for i, _ in carried], metrics=metrics.summary(), carried_samples=carried
        )
    unread = job.view[rounds.read_count :]
    mine = [i for i, _, _ in leftover] + unread
    return EpochResult(
        carry=deal_carry(group.gather_indices(mine), job.rank), metrics=metrics.summary()
    )


def deal_carry(per_rank: list[list[int]], rank: int) -> list[int]:
    """This rank's share of the epoch's carry, dealt round-robin over all ranks' carries.

    Without the deal a rank that ends an epoch behind starts the next one with a longer
    view, so it stays behind, and its carry can grow epoch after epoch. Dealt, views of
    the next epoch differ in length by at most 2 (carry and fresh share +-1 each), which
    keeps every rank's carry within ``2 * buffer_size + 2`` (``docs/protocol.md`` G4).
    """
    everything = [i for carry in per_rank for i in carry]
    return everything[rank :: len(per_rank)]


def _group_fill(budget: TokenBudget, lengths: list[int]) -> float:
    measure = GroupMeasure()
    for length in lengths:
        measure = measure.plus(length)
    return budget.fill(measure)


def _attach(
    item: tuple[MutableMapping[str, Any], StepInfo], window_tokens: int, normalizer: float
) -> MutableMapping[str, Any]:
    batch, info = item
    batch[STEP_INFO_KEY] = replace(
        info, window_loss_tokens=window_tokens, loss_normalizer=normalizer
    )
    return batch


class _RoundState:
    """Collates a round's groups and IDLE steps into batches with partial step info."""

    def __init__(
        self,
        job: EpochJob,
        collate_fn: Callable[[list[Any]], Any],
        meter: SampleMeter,
        idle_template: Callable[[], Any],
        metrics: EpochMetrics,
    ) -> None:
        self.job = job
        self.collate_fn = collate_fn
        self.meter = meter
        self.idle_template = idle_template
        self.metrics = metrics
        self.template: Any = None
        self.round = 0
        self.step = 0
        self.read_tokens = 0

    def read(self, rounds: RankRounds, index: int, sample: Any) -> None:
        """Measure, validate and buffer one sample read from the view."""
        length, patches = self.meter(index, sample)
        if self.template is None:
            self.template = sample
        if self.job.config.budget.is_oversize(length, patches):
            self.metrics.oversize += 1
        rounds.add(length, patches, (index, sample, length))
        self.read_tokens += length

    def build(self, groups: list[list[Any]], idle: int) -> list[tuple[Any, StepInfo, int]]:
        """``(batch, partial step info, real tokens)`` per step, real steps first."""
        out = []
        for payloads in groups:
            lengths = [length for _, _, length in payloads]
            self.metrics.record_group(lengths, _group_fill(self.job.config.budget, lengths))
            batch = self._collate([sample for _, sample, _ in payloads])
            ids = tuple(index for index, _, _ in payloads)
            out.append((batch, self._step(batch, ids, idle=False), sum(lengths)))
        for _ in range(idle):
            self.metrics.steps += 1
            self.metrics.idle_steps += 1
            batch = self._idle_batch()
            out.append((batch, self._step(batch, (), idle=True), 0))
        self.round += 1
        return out

    def _step(self, batch: MutableMapping[str, Any], ids: tuple[int, ...], idle: bool) -> StepInfo:
        cfg = self.job.config
        tokens = count_loss_tokens(batch, cfg.label_key, cfg.ignore_index, cfg.shift_labels)
        info = StepInfo(
            epoch=self.job.epoch,
            step=self.step,
            round=self.round,
            idle=idle,
            sample_ids=ids,
            local_samples=len(ids),
            global_samples=0,
            local_loss_tokens=tokens,
            global_loss_tokens=0,
            window_loss_tokens=0,
            loss_normalizer=1.0,
            world_size=self.job.world_size,
            rank=self.job.rank,
        )
        self.step += 1
        return info

    def _collate(self, samples: list[Any]) -> MutableMapping[str, Any]:
        batch = self.collate_fn(samples)
        if not isinstance(batch, MutableMapping):
            raise TypeError(
                f"collate_fn returned a {type(batch).__name__}; ODB needs a dict "
                "batch so it can attach and pop the step info"
            )
        return batch

    def _idle_batch(self) -> MutableMapping[str, Any]:
        if self.template is None:
            self.template = self.idle_template()
        batch = self._collate([self.template])
        cfg = self.job.config
        labels = batch.get(cfg.label_key)
        if not isinstance(labels, torch.Tensor):
            raise ValueError(
                f"collate_fn output has no tensor {cfg.label_key!r}; IDLE steps mask "
                "the labels to contribute zero loss. Set label_key"
            )
        batch[cfg.label_key] = torch.full_like(labels, cfg.ignore_index)
        return batch
