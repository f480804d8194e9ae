"""The collate side's epoch driver (``run_epoch``): its pure parts, and one rank's epoch
with no peers (real tensors, no processes): when the first batch leaves and what the
grouping buffer holds in bytes."""

from __future__ import annotations

import gc
import time
import weakref
from dataclasses import replace

import pytest
import torch

from odb._process.collate_epoch import deal_carry, run_epoch
from odb._process.comm import AlignmentGroup
from odb._process.messages import EpochJob
from odb.collate import PadCollate
from odb.core.config import ODBConfig
from odb.core.steps import SampleMeter


def test_deal_carry_balances_and_conserves() -> None:
    per_rank = [[1, 2, 3, 4, 5, 6, 7], [], [8]]
    shares = [deal_carry(per_rank, rank) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(1, 9))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_deal_carry_single_rank_keeps_its_carry_in_order() -> None:
    assert deal_carry([[5, 3, 9]], 0) == [5, 3, 9]


# ------------------------------------------- the epoch's start and the buffer's bytes


def _epoch(
    cfg: ODBConfig, lengths: list[int], pixels: int = 0, collate_cpu_s: float = 0.0
) -> tuple[dict, list[int]]:
    """``run_epoch`` on one rank with no peers over real tensors (``pixels`` float32 of
    image data per sample; each collate busy for ``collate_cpu_s`` of thread CPU).
    Returns the epoch's metrics and, per emitted batch, how many samples had been read
    when it was handed over."""
    reads: list[int] = []
    emitted: list[int] = []

    def samples():
        for i, n in enumerate(lengths):
            reads.append(i)
            ids = torch.full((n,), i, dtype=torch.long)
            yield i, {"input_ids": ids, "labels": ids.clone(), "pixels": torch.zeros(pixels)}

    def collate(batch: list[dict]) -> dict:
        busy_until = time.thread_time() + collate_cpu_s
        while time.thread_time() < busy_until:
            pass
        return PadCollate()([{k: s[k] for k in ("input_ids", "labels")} for s in batch])

    view = list(range(len(lengths)))
    result = run_epoch(
        EpochJob(cfg, 0, 0, 1, view),
        samples(),
        AlignmentGroup(None, "test/"),
        collate,
        SampleMeter(cfg),
        lambda: {"input_ids": torch.ones(1, dtype=torch.long), "labels": torch.ones(1)},
        lambda batch: emitted.append(len(reads)),
        lambda: cfg.queue_depth,
    )
    return result.metrics, emitted


def test_the_first_batch_leaves_after_a_few_reads_not_a_whole_buffer() -> None:
    """The ramp: the first round groups ``initial_buffer_budgets`` budgets, so the first
    batch is collated after about that many budgets' worth of reads; without the ramp
    the whole buffer (64 budgets, most of this epoch) is read first."""
    lengths = [50 + (i * 37) % 200 for i in range(600)]  # 50-249 tokens
    ramp = ODBConfig(token_budget=1024, shuffle=False)
    whole = replace(ramp, initial_buffer_budgets=ramp.buffer_budgets)
    ramp_stats, ramp_emits = _epoch(ramp, lengths)
    whole_stats, whole_emits = _epoch(whole, lengths)
    assert whole_emits[0] >= 64 * 1024 // 250  # a full buffer of samples < 250 tokens
    # 4 budgets (the default initial buffer) of samples of >= 50 tokens
    assert ramp_emits[0] <= ramp.initial_buffer_budgets * 1024 // 50 + 1
    assert ramp_stats["samples"] == whole_stats["samples"] == len(lengths)
    assert 0 < ramp_stats["first_emit_s"] and 0 < whole_stats["first_emit_s"]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_collate_cpu_s_counts_the_collate_sides_cpu(mode: str) -> None:
    """A collate function that burns 20 ms of CPU per step: the epoch's collate_cpu_s
    holds at least that much (and the epoch's other work on top)."""
    cfg = ODBConfig(token_budget=64, shuffle=False, collate_mode=mode)
    stats, _ = _epoch(cfg, [20] * 30, collate_cpu_s=0.02)
    assert stats["collate_cpu_s"] >= 0.02 * stats["steps"]


def test_the_buffer_stops_reading_at_buffer_bytes() -> None:
    """Samples of about 5 kB (4000 bytes of image data, 16 per token of ids and labels):
    a 10000-byte buffer reads while under the cap, so it peaks below the cap plus one
    sample, and every sample is still emitted once."""
    lengths = [30 + i % 50 for i in range(120)]
    largest = 4000 + 16 * max(lengths)
    cfg = ODBConfig(token_budget=256, shuffle=False, buffer_bytes=10_000)
    stats, _ = _epoch(cfg, lengths, pixels=1000)
    assert 10_000 <= stats["peak_buffer_bytes"] < 10_000 + largest
    assert stats["samples"] == len(lengths)
    free, _ = _epoch(replace(cfg, buffer_bytes=2**30), lengths, pixels=1000)
    assert free["peak_buffer_bytes"] > 10_000 + largest


def test_one_sample_over_buffer_bytes_is_still_read() -> None:
    """The cap is checked before a read, so an empty buffer always reads: a sample
    larger than the whole cap passes through alone instead of stalling the epoch."""
    cfg = ODBConfig(token_budget=256, shuffle=False, buffer_bytes=100)
    stats, _ = _epoch(cfg, [40] * 5, pixels=1000)
    assert stats["peak_buffer_bytes"] == 4000 + 16 * 40  # one sample: image, ids, labels
    assert (stats["samples"], stats["steps"]) == (5, 5)


def _epoch_with_trainer(cfg: ODBConfig, lengths: list[int], keeps: bool) -> tuple[dict, list[int]]:
    """``run_epoch`` whose trainer keeps every batch (``keeps``) or frees each at once;
    the epoch driver is told the bytes the trainer holds. Returns the metrics and each step's
    sample count."""
    held: list[int] = []
    sizes: list[int] = []

    def samples():
        for i, n in enumerate(lengths):
            ids = torch.full((n,), i)
            yield i, {"input_ids": ids, "labels": ids.clone(), "pixels": torch.zeros(1000)}

    def emit(batch: dict) -> None:
        sizes.append(len(batch["pixels"]) // 1000)
        if keeps:
            held.append(sum(batch[k].nbytes for k in ("pixels", "input_ids", "labels")))

    def collate(group: list[dict]) -> dict:
        batch = PadCollate()([{k: s[k] for k in ("input_ids", "labels")} for s in group])
        return {**batch, "pixels": torch.cat([s["pixels"] for s in group])}

    result = run_epoch(
        EpochJob(cfg, 0, 0, 1, list(range(len(lengths)))),
        samples(),
        AlignmentGroup(None, "test/"),
        collate,
        SampleMeter(cfg),
        lambda: {"input_ids": torch.ones(1, dtype=torch.long), "labels": torch.ones(1)},
        emit,
        lambda: cfg.queue_depth,
        lambda: sum(held),
    )
    return result.metrics, [s for s in sizes if s]


def test_batches_the_trainer_holds_count_against_buffer_bytes() -> None:
    """A trainer that frees each batch at once leaves the buffer its whole byte cap
    (steps of several samples); one that keeps every batch fills the cap with them, so
    the buffer then reads one sample at a time (an empty buffer always reads) instead
    of piling more data on what the trainer holds. Every sample leaves once either way."""
    lengths = [20] * 80  # 4000 bytes of pixels + 320 of ids and labels per sample
    cfg = ODBConfig(token_budget=200, shuffle=False, buffer_bytes=40_000)
    frees, free_sizes = _epoch_with_trainer(cfg, lengths, keeps=False)
    keeps, kept_sizes = _epoch_with_trainer(cfg, lengths, keeps=True)
    assert sum(free_sizes) == sum(kept_sizes) == len(lengths)
    assert max(free_sizes[5:]) >= 5  # the byte cap holds ~9 samples: full steps
    assert max(kept_sizes[10:]) == 1  # what the trainer holds passed the cap
    assert keeps["peak_buffer_bytes"] >= 80 * 4000  # the held batches are counted
    assert frees["peak_buffer_bytes"] < 40_000 + 4320


@pytest.mark.parametrize("cost_model", ["padded", "packed"])
def test_the_epoch_driver_prices_padded_tokens_with_the_cost_model(cost_model: str) -> None:
    lengths = [(i * 13) % 40 + 3 for i in range(60)] + [70]  # the last one is oversize
    cfg = ODBConfig(token_budget=64, cost_model=cost_model, shuffle=False)
    metrics, _ = _epoch(cfg, lengths)
    assert metrics["real_tokens"] == sum(lengths) and metrics["samples"] == len(lengths)
    assert metrics["oversize"] == 1 and metrics["budget_violations"] == 0
    if cost_model == "packed":
        assert metrics["padded_tokens"] == sum(lengths)
    else:
        assert metrics["padded_tokens"] > sum(lengths)


# ------------------------------------------------- what an epoch that failed leaves behind


class _EndedInTheWait(Exception):
    """How the test group ends its status exchange (as a stop or a peer's failure does)."""


class _FailingInTheWait(AlignmentGroup):
    """A one-rank group whose status exchange is a pending collective: it reads ahead while
    it waits (the next pull fails, and the read-ahead keeps that error for later), then
    ends with another error before the epoch reaches the kept one."""

    def __init__(self, reading_ahead: list[bool]) -> None:
        super().__init__(None, "test/")
        self.reading_ahead = reading_ahead

    def gather_status(self, row, while_waiting=None):  # noqa: ANN001, ANN201 - the base's
        self.reading_ahead.append(True)
        while while_waiting is not None and while_waiting():
            pass
        raise _EndedInTheWait


def test_an_epoch_ended_while_an_error_is_read_ahead_frees_its_samples_at_once() -> None:
    """The read-ahead keeps a pull's error for the round that would reach it; its traceback
    references the rank that keeps it. An epoch ended before that round (a stop, a peer's
    failure) must not leave the two in a reference cycle: the cycle held every sample read
    (in thread mode, their shared-memory file descriptors) and the DataLoader iterator
    until the next garbage collection (test_resources_return_to_baseline[thread], 5 of 24
    runs). With the garbage collector off, nothing of the epoch survives it."""
    cfg = ODBConfig(token_budget=256, shuffle=False)
    reading_ahead: list[bool] = []
    alive: list[weakref.ref] = []

    def samples():
        for i in range(400):
            if reading_ahead:
                raise RuntimeError("the dataset failed while the rank read ahead")
            ids = torch.full((20,), i)
            alive.append(weakref.ref(ids))
            yield i, {"input_ids": ids, "labels": ids.clone()}

    gc.collect()
    gc.disable()
    try:
        try:
            run_epoch(
                EpochJob(cfg, 0, 0, 1, list(range(400))),
                samples(),
                _FailingInTheWait(reading_ahead),
                PadCollate(),
                SampleMeter(cfg),
                lambda: {"input_ids": torch.ones(1, dtype=torch.long), "labels": torch.ones(1)},
                lambda batch: None,
                lambda: cfg.queue_depth,
            )
        except _EndedInTheWait:
            pass
        held = sum(ref() is not None for ref in alive)
    finally:
        gc.enable()
    assert alive and held == 0, f"{held} of {len(alive)} samples outlived the epoch"
