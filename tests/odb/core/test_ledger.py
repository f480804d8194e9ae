"""The exactly-once ledger alone (odb/core/ledger.py): no loader, no processes, no collectives.

Each test drives ledgers the way loaders do (begin, record what a training loop received,
finish) and checks the resume contract on the merged pieces: an index received before a
save is never owed again in that epoch, every other one is, at any world size.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.core.ledger import Ledger
from odb.core.resume import StatePiece, merge_pieces
from odb.core.sharding import epoch_order

N = 23


def _ledgers(world_size: int, shard: str = "odb", size: int | None = N) -> list[Ledger]:
    return [Ledger(r, world_size, shard, 0, size, seed=3, shuffle=True) for r in range(world_size)]


def _order(epoch: int = 0) -> list[int]:
    return epoch_order(N, 3, epoch, True)


def _run(ledgers: list[Ledger], order: list[int], taken: list[int], rng: random.Random) -> list:
    """Each rank receives ``taken[r]`` of its view, in an order the collate side chose."""
    received = []
    for ledger, k in zip(ledgers, taken, strict=True):
        view = ledger.begin_map(order)
        rng.shuffle(view)  # groups leave the collate side in any order
        for start in range(0, k, 2):
            ledger.record(view[start : min(start + 2, k)])
        received += view[:k]
    return received


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 4),
    new_world=st.integers(1, 4),
    fractions=st.lists(st.floats(0, 1), min_size=4, max_size=4),
    seed=st.integers(0, 10**6),
    again=st.booleans(),
)
def test_every_index_once_across_a_resume_at_any_world_size(
    world: int, new_world: int, fractions: list[float], seed: int, again: bool
) -> None:
    rng = random.Random(seed)
    order = _order()
    ledgers = _ledgers(world)
    views = [len(order[r::world]) for r in range(world)]
    taken = [int(f * v) for f, v in zip(fractions, views, strict=False)]
    before = _run(ledgers, order, taken, rng)
    pieces = [ledger.piece() for ledger in ledgers]
    if again:  # restore, save again before iterating, restore that: still the same state
        middle = _ledgers(world)
        for ledger in middle:
            ledger.load(pieces)
        pieces = [ledger.piece() for ledger in middle]
    rng.shuffle(pieces)
    resumed = _ledgers(new_world)
    for ledger in resumed:
        ledger.load(pieces)
    after = [i for ledger in resumed for i in ledger.begin_map(order)]
    assert sorted(before + after) == list(range(N))


def test_piece_is_the_ledger_alone_and_round_trips() -> None:
    (ledger,) = _ledgers(1)
    view = ledger.begin_map(_order())
    ledger.record(view[:5])
    first = ledger.piece()
    assert ledger.piece() == first  # reading it changes nothing
    back = StatePiece.from_dict(first.to_dict())  # the bitmap keeps the set, not the order
    assert back == replace(first, state=replace(first.state, consumed=tuple(sorted(view[:5]))))
    assert first.state.consumed == tuple(view[:5]) and not first.state.epoch_done


def test_second_resume_keeps_what_the_first_restored() -> None:
    """Consumed before the first save, then after the restore: both stay consumed."""
    order = _order()
    (first,) = _ledgers(1)
    view = first.begin_map(order)
    first.record(view[:4])
    second = _ledgers(2)
    for ledger in second:
        ledger.load([first.piece()])
    views = [ledger.begin_map(order) for ledger in second]
    for ledger, v in zip(second, views, strict=True):
        ledger.record(v[:3])
    (third,) = _ledgers(1)
    third.load([ledger.piece() for ledger in second])
    rest = third.begin_map(order)
    assert sorted(view[:4] + views[0][:3] + views[1][:3] + rest) == list(range(N))


def test_non_join_carry_goes_first_into_the_next_epoch_and_survives_a_save() -> None:
    (ledger,) = _ledgers(1)
    view = ledger.begin_map(_order(0))
    ledger.record(view[:-3])
    ledger.finish(view[-3:], [])
    done = ledger.piece().state
    assert done.epoch_done and done.carry_next == tuple(view[-3:])
    (resumed,) = _ledgers(1)
    resumed.load([ledger.piece()])
    assert resumed.epoch == 1
    assert resumed.piece().state.carry_in == tuple(view[-3:])  # saved again before epoch 1
    nxt = resumed.begin_map(_order(1))
    assert nxt[:3] == view[-3:] and sorted(nxt[3:]) == list(range(N))
    resumed.record(nxt[:2])
    state = resumed.piece().state
    assert state.carry_in == tuple(view[-3:]) and state.consumed == tuple(nxt[:2])
    assert len(state.remaining(_order(1))) == N + 1  # quota: carry + epoch - consumed


def test_carry_is_dealt_over_the_ranks_that_resume() -> None:
    ledgers = _ledgers(2)
    carries = []
    for ledger in ledgers:
        view = ledger.begin_map(_order(0))
        ledger.record(view[:-2])
        ledger.finish(view[-2:], [])
        carries += view[-2:]
    resumed = _ledgers(1)[0]
    resumed.load([ledger.piece() for ledger in ledgers])
    assert sorted(resumed.begin_map(_order(1))[:4]) == sorted(carries)


def test_skipping_the_restored_epoch_starts_the_new_one_fresh() -> None:
    (ledger,) = _ledgers(1)
    ledger.set_epoch(2)
    ledger.record(ledger.begin_map(_order(2))[:5])
    (resumed,) = _ledgers(1)
    resumed.load([ledger.piece()])
    resumed.set_epoch(2)  # the same epoch: the restore stands
    assert len(resumed.piece().state.consumed) == 5
    resumed.set_epoch(3)
    assert resumed.piece().state.consumed == () and resumed.piece().state.epoch == 3
    assert sorted(resumed.begin_map(_order(3))) == list(range(N))


def test_per_rank_data_resumes_each_rank_from_its_own_piece() -> None:
    ledgers = _ledgers(2, shard="rank")
    own = [list(range(10)), list(range(7))]  # each rank's dataset is its own
    taken = []
    for ledger, order in zip(ledgers, own, strict=True):
        view = ledger.begin_map(order)
        assert view == order  # not dealt: the data is the rank's
        ledger.record(view[:3])
        taken.append(view[:3])
    pieces = [ledger.piece() for ledger in ledgers]
    for rank, order in enumerate(own):
        resumed = Ledger(rank, 2, "rank", 0, N, seed=3, shuffle=True)
        resumed.load(pieces[::-1])
        assert sorted(taken[rank] + resumed.begin_map(order)) == order
    with pytest.raises(ValueError, match="resumes only at world size 2, not 1"):
        Ledger(0, 1, "rank", 0, N, seed=3, shuffle=True).load(pieces)


def test_stream_ledger_skips_consumed_positions_and_hands_over_carried_samples() -> None:
    (ledger,) = _ledgers(1, size=None)
    skip, carried = ledger.begin_stream()
    assert skip == frozenset() and carried == []
    ledger.record([0, 2, 5])
    (resumed,) = _ledgers(1, size=None)
    resumed.load([ledger.piece()])
    assert resumed.begin_stream()[0] == {0, 2, 5}
    resumed.finish([9], [(9, {"x": 1})])
    skip, carried = resumed.begin_stream()
    assert skip == frozenset() and carried == [(9, {"x": 1})]
    assert resumed.piece().state.carry_in == (9,)


@pytest.mark.parametrize(
    ("saved", "loading", "message"),
    [
        (Ledger(0, 1, "odb", 0, N, seed=3, shuffle=True), _ledgers(1, size=N + 1)[0], "samples"),
        (Ledger(0, 1, "odb", 0, N, seed=4, shuffle=True), _ledgers(1)[0], "seed=4"),
        (Ledger(0, 1, "odb", 0, N, seed=3, shuffle=False), _ledgers(1)[0], "shuffle=False"),
        (Ledger(0, 1, "rank", 0, N, seed=3, shuffle=True), _ledgers(1)[0], "shard='rank'"),
        (_ledgers(1)[0], _ledgers(1, size=None)[0], "reads a stream"),
        (
            Ledger(0, 1, "worker", 2, None, seed=3, shuffle=True),
            Ledger(0, 1, "worker", 3, None, seed=3, shuffle=True),
            "num_workers=2",
        ),
    ],
)
def test_a_mismatched_state_is_refused_naming_the_value(
    saved: Ledger, loading: Ledger, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        loading.load([saved.piece()])
    assert loading.epoch == 0 and loading.piece().state.consumed == ()  # left untouched


def test_a_stream_checkpoint_with_carried_samples_is_refused() -> None:
    (ledger,) = _ledgers(1, size=None)
    ledger.begin_stream()
    ledger.finish([4], [(4, {})])
    with pytest.raises(ValueError, match="carried samples"):
        _ledgers(1, size=None)[0].load([ledger.piece()])


def test_missing_pieces_are_named() -> None:
    ledgers = _ledgers(3)
    for ledger in ledgers:
        ledger.record(ledger.begin_map(_order())[:1])
    with pytest.raises(ValueError, match=r"missing the pieces of ranks \[1\]"):
        _ledgers(1)[0].load([ledgers[0].piece(), ledgers[2].piece()])
    whole = merge_pieces([ledger.piece() for ledger in ledgers])
    assert len(whole.consumed) == 3
