"""The lockstep round driver (``odb.core.lockstep``): its payloads, its two halves, and that
the epoch driver and the in-memory world run the same rounds.

The protocol's guarantees under the driver are the state machine's
(``tests/odb/core/test_rounds_machine.py``); here: the wire format of collective 2, what
the driver adds to ``RankRounds`` (the fill loop, a stream's end, ``max_age``, a peer's
failure, the plan check), and one epoch run both by
``odb._process.collate_epoch.run_epoch`` (one rank, no peers) and by ``odb.planning.simulate``
giving the same steps.
"""

from __future__ import annotations

import doctest
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import odb.core.buffer
import odb.core.lockstep
import odb.core.rounds
import odb.core.steps
from odb._process.collate_epoch import run_epoch
from odb._process.comm import AlignmentGroup
from odb._process.messages import EpochJob
from odb.collate import PadCollate
from odb.core.alignment import RankStatus
from odb.core.config import ODBConfig
from odb.core.lockstep import (
    LockstepRank,
    LockstepWorld,
    PeerFailedError,
    Reading,
    RoundCounts,
    StepCounts,
)
from odb.core.rounds import RankRounds
from odb.core.step_info import STEP_INFO_KEY
from odb.core.steps import SampleMeter
from odb.planning.simulate import simulate

INT64 = st.integers(0, 2**62)


@pytest.mark.parametrize(
    "module", [odb.core.lockstep, odb.core.rounds, odb.core.buffer, odb.core.steps]
)
def test_docstring_examples_run(module):
    assert doctest.testmod(module).failed == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(INT64, INT64, INT64), max_size=8), INT64, INT64)
def test_round_counts_row_round_trip(steps, read_samples, read_tokens):
    counts = RoundCounts(tuple(StepCounts(*s) for s in steps), read_samples, read_tokens)
    row = counts.to_row()
    assert len(row) == 3 * len(steps) + 2
    assert RoundCounts.from_row(row) == counts


def test_round_counts_sum_is_the_sum_of_the_fields():
    """What the all-reduce does to two ranks' rows is what it means for the fields."""
    a = RoundCounts((StepCounts(2, 7, 9), StepCounts(0, 0, 0)), 5, 40)
    b = RoundCounts((StepCounts(1, 3, 4), StepCounts(3, 8, 11)), 6, 51)
    summed = RoundCounts.from_row([x + y for x, y in zip(a.to_row(), b.to_row(), strict=True)])
    assert summed == RoundCounts((StepCounts(3, 10, 13), StepCounts(3, 8, 11)), 11, 91)


@pytest.mark.parametrize("width", [0, 1, 3, 4, 6])
def test_round_counts_rejects_a_row_of_the_wrong_width(width):
    with pytest.raises(ValueError, match=f"3 \\* steps \\+ 2 fields, got {width}"):
        RoundCounts.from_row([0] * width)


def _pull(readings):
    it = iter(readings)
    return lambda: next(it, None)


def test_a_stream_ends_when_its_pull_does():
    cfg = ODBConfig(token_budget=64, buffer_size=8)
    rank = LockstepRank(RankRounds(cfg, None), _pull([Reading(5, 0, i) for i in range(3)]))
    status = rank.report(lambda: 2)
    assert (status.read_count, status.read_done, status.unread, status.free_slots) == (
        3,
        True,
        0,
        2,
    )
    assert rank.rounds.view_size == 3


def test_free_slots_are_asked_after_the_reads():
    cfg = ODBConfig(token_budget=64, buffer_size=8)
    read = []

    def pull():
        read.append(len(read))
        return Reading(5, 0, read[-1]) if len(read) <= 3 else None

    status = LockstepRank(RankRounds(cfg, None), pull).report(lambda: len(read))
    assert status.free_slots == 4  # three samples and the end of the stream


def test_max_age_is_the_oldest_at_any_report():
    """A sample that waits is older at each report; ``max_age`` keeps the oldest."""
    cfg = ODBConfig(token_budget=100, buffer_size=8, buffer_budgets=1, age_limit=3)
    world = LockstepWorld(
        [
            LockstepRank(RankRounds(cfg, 2), _pull([Reading(60, 0, "a"), Reading(60, 0, "b")]), 0),
            LockstepRank(RankRounds(cfg, 1), _pull([Reading(10, 0, "c")]), 1),
        ]
    )
    ages = []
    while True:
        statuses, outcomes = world.round([4, 4])
        ages.append([rank.rounds.buffer.max_age for rank in world.ranks])
        if outcomes[0].plan.end:
            break
    assert [rank.max_age for rank in world.ranks] == [max(col) for col in zip(*ages, strict=True)]


def test_the_buffer_starts_small_and_doubles_every_round():
    """Samples of one budget each, one step per round: the buffer reads up to 1, 2, 4,
    then its full 8 budgets (``buffer_budgets_in_round``), whatever it emitted."""
    cfg = ODBConfig(token_budget=10, buffer_budgets=8, initial_buffer_budgets=1, queue_depth=1)
    world = LockstepWorld(
        [LockstepRank(RankRounds(cfg, 100), _pull([Reading(10, 0, i) for i in range(100)]))]
    )
    held = []
    for _ in range(6):
        (status,), _ = world.round([1])
        held.append(status.buffered_tokens // 10)
    assert held == [1, 2, 4, 8, 8, 8]
    no_ramp = replace(cfg, initial_buffer_budgets=8)
    rank = LockstepRank(RankRounds(no_ramp, 100), _pull([Reading(10, 0, i) for i in range(100)]))
    assert rank.report(lambda: 1).buffered_tokens == 80


def test_the_byte_cap_stops_reading_but_never_starves_the_buffer():
    """Reading stops once the buffer holds ``buffer_bytes``; an empty buffer reads even
    a sample larger than the cap, so every round has a sample to emit."""
    cfg = ODBConfig(token_budget=100, buffer_bytes=50, buffer_size=8)
    rank = LockstepRank(
        RankRounds(cfg, 6),
        _pull([Reading(1, 0, i, nbytes) for i, nbytes in enumerate([20, 20, 20, 200, 5, 5])]),
    )
    status = rank.report(lambda: 4)
    assert (status.buffered, rank.rounds.buffer.nbytes) == (3, 60)  # stopped at >= 50
    assert status.ready == 1  # a full buffer cannot read more: its group is ready
    assert rank.decide([status]).payloads == [[0, 1, 2]]
    status = rank.report(lambda: 4)  # empty: reads the 200-byte sample, then stops
    assert (status.buffered, rank.rounds.buffer.nbytes) == (1, 200)
    assert rank.rounds.buffer.peak_nbytes == 200


def test_a_peer_failure_raises_on_every_rank():
    cfg = ODBConfig(token_budget=64)
    rank = LockstepRank(RankRounds(cfg, 1), _pull([Reading(5, 0, "a")]), rank=0)
    mine = rank.report(lambda: 4)
    peer = replace(mine, failed=True)
    with pytest.raises(PeerFailedError, match=r"ODB ranks \[1\] failed; rank 0 stops"):
        rank.decide([mine, peer])


def test_the_world_refuses_ranks_that_plan_differently():
    """Ranks with different settings derive different plans: a bug the world reports."""
    world = LockstepWorld(
        [
            LockstepRank(
                RankRounds(ODBConfig(token_budget=64, queue_depth=depth), 4),
                _pull([Reading(40, 0, i) for i in range(4)]),  # four groups of one
            )
            for depth in (1, 2)
        ]
    )
    with pytest.raises(AssertionError, match="different plans"):
        world.round([4, 4])


def test_the_gathered_statuses_go_through_the_wire_row():
    cfg = ODBConfig(token_budget=64)
    world = LockstepWorld([LockstepRank(RankRounds(cfg, 1), _pull([Reading(5, 0, "a")]))])
    (status,) = world.report([3])
    assert RankStatus.from_row(status.to_row()) == status
    (outcome,) = world.decide([status])
    assert outcome.payloads == [["a"]]


# ------------------------------------------------------------ reading ahead in a wait


def _world_run(views, cfg: ODBConfig, ahead: list[int] | None):
    """Rounds of a world over ``views`` until the epoch ends: every status and payload.
    With ``ahead``, rank r calls ``read_ahead`` up to ``ahead[round % len(ahead)] + r``
    times between the report and the decision (where ``run_epoch`` waits for its peers)."""
    ranks = [
        LockstepRank(RankRounds(cfg, len(v)), _pull([Reading(n, 0, i, 10 * n) for i, n in v]), r)
        for r, v in enumerate(views)
    ]
    world, trace = LockstepWorld(ranks), []
    for round_index in range(10_000):
        statuses = world.report([cfg.queue_depth] * len(ranks))
        for r, rank in enumerate(ranks if ahead else []):
            for _ in range(ahead[round_index % len(ahead)] + r):
                if not rank.read_ahead():
                    break
        outcomes = world.decide(statuses)
        trace.append((statuses, [o.payloads for o in outcomes]))
        if outcomes[0].plan.end:
            return trace, ranks
    raise AssertionError("the epoch did not end")


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 120), min_size=1, max_size=80),
    ahead=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    join=st.booleans(),
    buffer_size=st.integers(2, 12),
    buffer_bytes=st.integers(50, 3000),
)
def test_reading_ahead_leaves_every_round_unchanged(lengths, ahead, join, buffer_size,
                                                    buffer_bytes):
    """Samples read ahead while a rank waits are kept aside and taken first by the next
    report: every status and every step is the one the rank makes without them."""
    views = [list(enumerate(lengths))[r::2] for r in range(2)]
    cfg = ODBConfig(token_budget=128, join=join, buffer_size=buffer_size,
                    buffer_bytes=buffer_bytes, buffer_budgets=2, initial_buffer_budgets=1)
    plain, _ = _world_run(views, cfg, None)
    read_ahead, ranks = _world_run(views, cfg, ahead)
    assert read_ahead == plain
    for rank in ranks:  # held together with the buffer within its caps (+ one sample)
        assert rank.peak_bytes < buffer_bytes + 10 * 120


def test_read_ahead_stops_at_the_caps_the_view_and_the_read_limit():
    cfg = ODBConfig(token_budget=100, buffer_bytes=50, buffer_size=4)
    pull = _pull([Reading(1, 0, i, 20) for i in range(10)])
    rank = LockstepRank(RankRounds(cfg, 10), pull)
    rank.report(lambda: 4)  # the buffer holds 3 samples, 60 bytes: past the byte cap
    assert not rank.read_ahead() and rank.read_ahead_count == 0
    rank.decide([rank.rounds.status(4)])  # emits all three
    assert rank.read_ahead() and rank.read_ahead() and not rank.read_ahead()  # 60 bytes
    assert rank.read_ahead_count == 3 and rank.peak_bytes == 60
    unlimited = replace(cfg, buffer_bytes=10**6)
    rank = LockstepRank(RankRounds(unlimited, 3), _pull([Reading(1, 0, i) for i in range(9)]))
    rank.report(lambda: 4)
    assert not rank.read_ahead()  # the view's three samples are all read
    capped = LockstepRank(RankRounds(unlimited, 9), _pull([Reading(1, 0, i) for i in range(9)]))
    capped.rounds.read_limit = 2  # the last round's non-join limit
    capped.report(lambda: 4)
    assert not capped.read_ahead() and capped.rounds.read_count == 2


def test_a_pull_error_while_reading_ahead_is_raised_where_report_reaches_it():
    cfg = ODBConfig(token_budget=100, buffer_budgets=1, initial_buffer_budgets=1)

    def pull_then_fail():
        yield Reading(60, 0, "a")
        yield Reading(60, 0, "b")
        raise ValueError("sample 2 is broken")

    samples = pull_then_fail()
    rank = LockstepRank(RankRounds(cfg, 5), lambda: next(samples))
    status = rank.report(lambda: 4)  # reads "a" and "b" (120 tokens >= one budget)
    assert status.read_count == 2
    assert not rank.read_ahead()  # the error is kept, not raised in the wait
    assert rank.decide([status]).payloads == [["a"], ["b"]]
    with pytest.raises(ValueError, match="sample 2 is broken"):
        rank.report(lambda: 4)


def test_a_streams_samples_read_ahead_are_handed_back_for_the_carry():
    cfg = ODBConfig(token_budget=100, buffer_budgets=1, initial_buffer_budgets=1)
    rank = LockstepRank(RankRounds(cfg, None), _pull([Reading(60, 0, i) for i in range(4)]))
    rank.report(lambda: 4)
    while rank.read_ahead():
        pass
    assert [r.payload for r in rank.unread_ahead()] == [2, 3]  # then the stream's end
    assert rank.unread_ahead() == []


# ------------------------------------------------ one driver: run_epoch == simulator


def _run_epoch_steps(lengths: list[int], cfg: ODBConfig) -> list[tuple[int, ...]]:
    """``run_epoch`` on one rank with no peers: the sample ids of every step."""

    def sample(i: int) -> dict[str, torch.Tensor]:
        ids = torch.full((lengths[i],), i, dtype=torch.long)
        return {"input_ids": ids, "labels": ids.clone()}

    view = list(range(len(lengths)))
    steps = []
    run_epoch(
        EpochJob(cfg, 0, 0, 1, view),
        ((i, sample(i)) for i in view),
        AlignmentGroup(None, "test/"),
        PadCollate(),
        SampleMeter(cfg),
        lambda: sample(0),
        lambda batch: steps.append(batch[STEP_INFO_KEY].sample_ids),
        lambda: cfg.queue_depth,
    )
    return steps


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["balanced", "paper"])
def test_run_epoch_and_the_simulator_run_the_same_rounds(seed, policy):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 120) for _ in range(rng.randint(30, 90))]
    cfg = ODBConfig(
        token_budget=128,
        policy=policy,
        buffer_size=rng.randint(4, 16),
        buffer_budgets=rng.randint(1, 4),
        queue_depth=rng.randint(1, 4),
        age_limit=rng.randint(1, 4),
        shuffle=False,
    )
    sim = simulate(lengths, cfg, views=[list(range(len(lengths)))])
    assert _run_epoch_steps(lengths, cfg) == [tuple(ids) for ids in sim.ranks[0].ids]


@pytest.mark.parametrize("cap", [1, 3])
def test_max_round_steps_caps_every_round_below_the_queue_depth(cap: int) -> None:
    lengths = [(i * 37) % 500 + 1 for i in range(400)]
    free = simulate(lengths, ODBConfig(token_budget=1024, queue_depth=8), world_size=2)
    capped = simulate(
        lengths, ODBConfig(token_budget=1024, queue_depth=8, max_round_steps=cap), world_size=2
    )
    assert max(free.targets) > cap  # the cap binds in this epoch
    assert max(capped.targets) <= cap
    emitted = sorted(i for r in capped.ranks for step in r.ids for i in step)
    assert emitted == list(range(len(lengths)))  # nothing lost under the cap
