"""The collate side's epoch: the lockstep round driver on real collectives.

One call of :func:`run_epoch` is one rank's epoch. It is the same code in the collate
process and in thread mode; only ``emit`` (the queue to the trainer) and the sample
iterator differ. Before the first round the ranks check that they agree on their
source (:func:`odb.core.sharding.check_source_rows`). Each round
(:mod:`odb.core.lockstep` is the round, without the transport):

1. read samples into the buffer until it holds the round's share of the buffer (small
   in the epoch's first round, so the first batch is out after a few reads; doubling
   every round), its sample cap or its byte cap, or the view is read;
2. group the buffer and report a fixed-size status to the peers (one all-gather);
   while the peers' statuses have not all arrived, read samples ahead for later
   rounds (:meth:`odb.core.lockstep.LockstepRank.read_ahead`: kept aside, so the rounds
   are the same; the DataLoader workers keep working while this rank waits);
3. derive the round's plan (:func:`odb.core.alignment.plan_round`, identical on all ranks)
   and this rank's ``T`` steps: real groups, split groups or IDLE steps;
4. collate them, sum the per-step counts over the ranks (one all-reduce of a
   :class:`odb.core.lockstep.RoundCounts`), and release steps whose gradient-accumulation
   window is complete (:class:`odb.core.loss.AccumulationNormalizer`).

The epoch ends in the same round on every rank; in non-join mode it leaves a carry for
the next epoch (:func:`deal_carry`). Errors name the sample index that caused them;
nothing is silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import replace
from typing import Any

from odb._process.comm import AlignmentGroup
from odb._process.messages import EpochJob, EpochResult
from odb.core.alignment import RankStatus
from odb.core.lockstep import LockstepRank, RoundCounts
from odb.core.loss import AccumulationNormalizer
from odb.core.metrics import EpochMetrics
from odb.core.rounds import RankRounds, RoundOutcome
from odb.core.sharding import check_source_rows
from odb.core.steps import SampleMeter, SampleReader, Step, StepBuilder, attach_step_info


def run_epoch(
    job: EpochJob,
    samples: Iterator[tuple[int, Any]],
    group: AlignmentGroup,
    collate_fn: Callable[[list[Any]], Any],
    meter: SampleMeter,
    idle_template: Callable[[], Any],
    emit: Callable[[Any], None],
    free_slots: Callable[[], int],
    held_bytes: Callable[[], int] | None = None,
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
        held_bytes: Bytes of the emitted batches the trainer has not released yet; the
            buffer's byte cap counts them (``ODBConfig.buffer_bytes``). None: none.
    """
    cfg = job.config
    metrics = EpochMetrics()
    cpu_clock = time.process_time if cfg.collate_mode == "process" else time.thread_time
    cpu_start = cpu_clock()
    emit = _timing_first(emit, metrics)
    epoch_samples = _check_sources(job, group)
    rounds = RankRounds(cfg, None if job.view is None else len(job.view), held_bytes)
    reader = SampleReader(cfg, samples, meter, idle_template, metrics)
    for index, sample in job.carried:  # a stream's carry from the last epoch comes first
        rounds.add(*reader.measure(index, sample))
    rank = LockstepRank(rounds, reader, job.rank)
    builder = StepBuilder(
        cfg, collate_fn, reader, metrics, epoch=job.epoch, rank=job.rank, world=job.world_size
    )
    windows = AccumulationNormalizer(cfg.grad_accum_steps, job.world_size)
    try:
        while (outcome := _align(rank, group, free_slots, metrics)) is not None:
            steps = builder.build(outcome)
            totals = _sum_counts(group, steps, rounds, metrics)
            for item in _release(steps, totals, epoch_samples, windows):
                emit(item)
        for held in windows.flush():
            emit(attach_step_info(*held))
        carry, carried = _carry(job, rank, group)
    except BaseException:
        # An epoch ended early must not keep its samples in a reference cycle.
        rank.discard_read_ahead()
        raise
    _close_metrics(metrics, rank, group, cpu_clock() - cpu_start)
    return EpochResult(carry=carry, metrics=metrics.summary(), carried_samples=carried)


def _close_metrics(
    metrics: EpochMetrics, rank: LockstepRank, group: AlignmentGroup, cpu_s: float
) -> None:
    """Fill in what the epoch's rank and group measured, once it ended."""
    rounds = rank.rounds
    metrics.max_age = rank.max_age
    metrics.read_ahead = rank.read_ahead_count
    metrics.align_bytes = group.bytes_sent
    metrics.recirculated = rounds.recirculated
    metrics.peak_buffer_bytes = max(rounds.buffer.peak_nbytes, rank.peak_bytes)
    metrics.collate_cpu_s = cpu_s


def _timing_first(emit: Callable[[Any], None], metrics: EpochMetrics) -> Callable[[Any], None]:
    """``emit`` that records the epoch-start stall: seconds from now to the first batch."""
    started = time.perf_counter()

    def timed(item: Any) -> None:
        if metrics.first_emit_s == 0.0:
            metrics.first_emit_s = time.perf_counter() - started
        emit(item)

    return timed


def _check_sources(job: EpochJob, group: AlignmentGroup) -> int:
    """The epoch's sample count over all ranks (0 if unknown), once the ranks agree.

    Before any sample is read every rank checks that the ranks agree on their source
    (same sharding; with ODB dealing, the same dataset size and epoch order), so a
    mismatch that would lose samples is an error on every rank, not a silent loss.
    """
    rows = group.gather_source_rows(job.source_row) if job.source_row else []
    epoch_samples = check_source_rows(rows) if rows else None
    return epoch_samples if epoch_samples is not None else 0


def _align(
    rank: LockstepRank,
    group: AlignmentGroup,
    free_slots: Callable[[], int],
    metrics: EpochMetrics,
) -> RoundOutcome | None:
    """Read, exchange the statuses (collective 1) and decide; None at the epoch's end."""
    status = rank.report(free_slots)
    started, reading = time.perf_counter(), rank.read_ahead_s
    rows = group.gather_status(status.to_row(), rank.read_ahead)
    # Waiting only: the reads ahead made meanwhile are not alignment time.
    metrics.align_seconds += time.perf_counter() - started - (rank.read_ahead_s - reading)
    statuses = [RankStatus.from_row(r) for r in rows]
    outcome = rank.decide(statuses)
    metrics.record_tail(statuses, outcome.plan.end)
    return None if outcome.plan.end else outcome


def _sum_counts(
    group: AlignmentGroup, steps: list[Step], rounds: RankRounds, metrics: EpochMetrics
) -> RoundCounts:
    """This round's counts summed over the ranks (collective 2)."""
    mine = RoundCounts(
        tuple(s.counts for s in steps),
        read_samples=rounds.read_count,
        read_tokens=rounds.read_tokens,
    )
    started = time.perf_counter()
    totals = RoundCounts.from_row(group.sum_counts(mine.to_row()))
    metrics.align_seconds += time.perf_counter() - started
    metrics.rounds += 1
    return totals


def _release(
    steps: list[Step], totals: RoundCounts, epoch_samples: int, windows: AccumulationNormalizer
) -> Iterator[MutableMapping[str, Any]]:
    """The round's batches with their global counts, as their windows complete."""
    for step, total in zip(steps, totals.steps, strict=True):
        info = replace(
            step.info,
            global_samples=total.samples,
            global_loss_tokens=total.loss_tokens,
            global_real_tokens=total.real_tokens,
            epoch_read_samples=totals.read_samples,
            epoch_read_tokens=totals.read_tokens,
            epoch_samples=epoch_samples,
        )
        for item in windows.push((step.batch, info), info.global_loss_tokens):
            yield attach_step_info(*item)


def _carry(
    job: EpochJob, rank: LockstepRank, group: AlignmentGroup
) -> tuple[list[int], list[tuple[int, Any]]]:
    """What the epoch leaves for the next: ``(carried indices, carried samples)``.

    Join mode leaves nothing. Non-join: a stream cannot be re-read by index, so its
    buffer's samples and those read ahead are carried themselves, on this rank; a view
    carries the indices of its buffer and of its unread tail (which holds the samples
    read ahead), dealt over all ranks (:func:`deal_carry`).
    """
    rounds = rank.rounds
    leftover = rounds.leftover()
    ahead = [reading.payload for reading in rank.unread_ahead()]
    if job.config.join:
        return [], []
    if job.view is None:
        carried = [(index, sample) for index, sample, _ in leftover + ahead]
        return [i for i, _ in carried], carried
    mine = [i for i, _, _ in leftover] + job.view[rounds.read_count :]
    return deal_carry(group.gather_indices(mine), job.rank), []


def deal_carry(per_rank: list[list[int]], rank: int) -> list[int]:
    """This rank's share of the epoch's carry, dealt round-robin over all ranks' carries.

    Without the deal a rank that ends an epoch behind starts the next one with a longer
    view, so it stays behind, and its carry can grow epoch after epoch. Dealt, views of
    the next epoch differ in length by at most 2 (carry and fresh share +-1 each), which
    keeps every rank's carry within ``2 * buffer_size + 2`` (``docs/protocol.md`` G4).
    """
    everything = [i for carry in per_rank for i in carry]
    return everything[rank :: len(per_rank)]
