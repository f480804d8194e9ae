"""Exactly-once mid-epoch resume, torchdata-style: run k steps, save, restore fresh, drain.

The union of ids yielded before the checkpoint and after the restore must be the
epoch's full id multiset (join) — or, in non-join mode, the epoch's ids minus the carry
it hands to the next epoch — with no duplicates, also when the world size changes.
Every rank saves its own piece without a collective; the restore takes all pieces.

The real-rank cases share their rank processes, spawned when a test first needs them
(``RealRanks``, through ``tests/odb/rank_calls``): one spawn per world size saves, one
per world size restores (5 spawns for 10 cases when the module runs whole; fewer for a
test run alone). A case that fails shows its traceback in every test that reads its
spawn. Each loader has its own process group, so cases in one process are independent.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

import odb
from harness.scenarios import LengthDataset
from odb.core.resume import LoaderState, merge_pieces, parse_pieces
from tests.odb.rank_calls import Call, LazyCalls, run_calls

LENGTHS = [(i * 29) % 150 + 1 for i in range(97)]
OPTIONS = dict(
    token_budget=256,
    buffer_budgets=2,
    queue_depth=2,
    collate_mode="thread",
    seed=5,
    align_timeout_s=60.0,
)


def _loader(join: bool) -> odb.ODBLoader:
    return odb.ODBLoader(LengthDataset(LENGTHS), join=join, **OPTIONS)


def _first_part(rank: int, world_size: int, k: int, join: bool) -> tuple[list[int], dict, int]:
    """Yield k steps of epoch 1 (or the whole epoch when k < 0), then save."""
    loader = _loader(join)
    loader.set_epoch(1)
    seen, steps = [], 0
    if k != 0:
        for batch in loader:  # a batch counts as consumed once the loop receives it
            seen += odb.pop_step_info(batch).sample_ids
            steps += 1
            if steps == k:
                break
    return seen, loader.state_dict(), steps


def _second_part(
    rank: int, world_size: int, pieces: list[dict], join: bool
) -> tuple[list[int], list[int]]:
    """The rest of epoch 1; (the ids yielded, the ids this rank carries to epoch 2)."""
    loader = _loader(join)
    loader.load_state_dict(pieces)
    loader.set_epoch(1)
    seen = [i for b in loader for i in odb.pop_step_info(b).sample_ids]
    carried = list(loader.state_dict()["carry_next"])
    assert len(carried) == loader.stats()["carried"]
    return seen, carried


def _check(before: list, after: list, join: bool) -> None:
    first = [i for ids, _, _ in before for i in ids]
    second = [i for ids, _ in after for i in ids]
    carried = [i for _, ids in after for i in ids]
    emitted = first + second
    assert len(emitted) == len(set(emitted)), "an id was yielded twice"
    if join:
        assert sorted(emitted) == list(range(len(LENGTHS))) and not carried
    else:  # every id is yielded once or carried to the next epoch, never both
        assert sorted(emitted + carried) == list(range(len(LENGTHS))), "an id lost or doubled"


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_single_process(k: int, join: bool) -> None:
    before = [_first_part(0, 1, k, join)]
    after = [_second_part(0, 1, before[0][1], join)]  # one dict: a whole state at W=1
    _check(before, after, join)


def test_resume_after_last_step_positions_next_epoch() -> None:
    seen, state, steps = _first_part(0, 1, -1, True)
    assert sorted(seen) == list(range(len(LENGTHS)))
    assert merge_pieces(parse_pieces(state)).epoch_done
    loader = _loader(True)
    loader.load_state_dict(state)
    assert loader.epoch == 2
    assert sorted(i for b in loader for i in odb.pop_step_info(b).sample_ids) == list(
        range(len(LENGTHS))
    )


TWO_RANKS = [(k, join) for join in (True, False) for k in (0, 1, 7)]  # (k, join)
ELASTIC = [(2, 1), (2, 3), (3, 2)]  # (old_world, new_world), 5 steps saved, join
# Per case: (world that saves, steps saved, join, world that restores).
PLAN = {("two", k, join): (2, k, join, 2) for k, join in TWO_RANKS}
PLAN |= {("elastic", old, new): (old, 5, True, new) for old, new in ELASTIC}


class RealRanks:
    """Every real-rank case, run when a test first needs it: ``self["rank0"]`` is the
    lone-save ranks' results; ``self[("two", k, join) | ("elastic", old, new)]`` is
    ``(before, after)``, each rank's return of the save and of the restore.

    Saves run through one :class:`LazyCalls` (a spawn per saving world size); reading
    a case restores every case that restores at its world size, in one spawn.
    """

    def __init__(self) -> None:
        # Rank 0's lone save first, while its process has no other loader that might
        # call a collective in the window where they are refused.
        saves = {"rank0": (2, _rank0_only_save, ())}
        saves |= {key: (w, _first_part, (k, join)) for key, (w, k, join, _) in PLAN.items()}
        self.saved = LazyCalls(saves)
        self._restored: dict[Any, list] = {}

    def _load(self, key: Any) -> Call:
        _, k, join, new_world = PLAN[key]
        pieces = [state for _, state, _ in self.saved[key]]
        if key[0] == "two":
            random.Random(k).shuffle(pieces)  # any order
        return new_world, _second_part, (pieces, join)

    def __getitem__(self, key: Any) -> Any:
        if key == "rank0":
            return self.saved[key]
        if key not in self._restored:
            world = PLAN[key][3]
            self._restored |= run_calls({k: self._load(k) for k, p in PLAN.items()
                                         if p[3] == world})
        return self.saved[key], self._restored[key]


@pytest.fixture(scope="module")
def real_ranks() -> RealRanks:
    return RealRanks()


@pytest.mark.dist
@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_two_ranks(real_ranks: RealRanks, k: int, join: bool) -> None:
    before, after = real_ranks[("two", k, join)]
    assert [state["rank"] for _, state, _ in before] == [0, 1], "each rank saves its own piece"
    _check(before, after, join)


@pytest.mark.dist
@pytest.mark.parametrize(("old_world", "new_world"), ELASTIC)
def test_elastic_resume(real_ranks: RealRanks, old_world: int, new_world: int) -> None:
    before, after = real_ranks[("elastic", old_world, new_world)]
    assert len(before) == old_world and len(after) == new_world
    _check(before, after, True)


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast",
               "broadcast_object_list", "barrier", "monitored_barrier", "gather",
               "gather_object", "scatter", "reduce", "send", "recv", "isend", "irecv")


@contextlib.contextmanager
def _collectives_refused() -> Iterator[None]:
    """Any ``torch.distributed`` collective or point-to-point call inside raises."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("state_dict called a torch.distributed collective")

    saved = {name: getattr(dist, name) for name in COLLECTIVES}
    try:
        for name in COLLECTIVES:
            setattr(dist, name, refuse)
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _rank0_only_save(rank: int, world_size: int) -> tuple[list[int], dict | None]:
    """Rank 0 alone calls state_dict mid-epoch (rank 1 never does); both finish the epoch."""
    loader = _loader(True)
    loader.set_epoch(1)
    seen, piece = [], None
    for step, batch in enumerate(loader, start=1):
        seen += odb.pop_step_info(batch).sample_ids
        if step == 3 and rank == 0:
            with _collectives_refused():
                piece = loader.state_dict()
    dist.barrier()
    return seen, piece


@pytest.mark.dist
def test_rank0_only_state_dict_needs_no_collective(real_ranks: RealRanks) -> None:
    results = real_ranks["rank0"]
    piece = results[0][1]
    assert piece is not None and piece["rank"] == 0 and piece["world_size"] == 2
    assert sorted(i for ids, _ in results for i in ids) == list(range(len(LENGTHS)))
    # Rank 0's piece alone is not the whole state: the load names the missing rank.
    with pytest.raises(ValueError, match=r"missing the pieces of ranks \[1\]"):
        _loader(True).load_state_dict([piece])


def test_pieces_are_small_plain_and_checked() -> None:
    import pickle

    loader = _loader(True)
    loader.set_epoch(1)
    for step, _ in enumerate(loader, start=1):
        if step == 4:
            break
    piece = loader.state_dict()
    assert len(pickle.dumps(piece)) < 400  # 97 samples: a 13-byte bitmap and a header
    assert all(not hasattr(v, "shape") for v in piece.values())
    with pytest.raises(ValueError, match=r"more than one piece of ranks \[0\]"):
        _loader(True).load_state_dict([piece, piece])
    with pytest.raises(ValueError, match="unknown keys"):
        _loader(True).load_state_dict([{**piece, "bogus": 1}])
    with pytest.raises(TypeError, match="list of dicts"):
        _loader(True).load_state_dict([])
    other = {**piece, "rank": 1, "world_size": 2, "epoch": 2}
    with pytest.raises(ValueError, match="different points"):
        _loader(True).load_state_dict([{**piece, "world_size": 2}, other])


def test_state_before_iterating_a_restored_epoch_is_the_restored_one() -> None:
    before = [_first_part(0, 1, 3, True)]
    restored = _loader(True)
    restored.load_state_dict(before[0][1])
    again = restored.state_dict()  # saved again before the restored epoch ran
    after = [_second_part(0, 1, again, True)]
    _check(before, after, True)


def test_version_one_state_still_loads() -> None:
    whole = LoaderState(1, len(LENGTHS), 5, True, consumed=(0, 1, 2)).to_dict()
    _check([([0, 1, 2], whole, 0)], [_second_part(0, 1, whole, True)], True)


def test_state_is_compact_and_strict() -> None:
    state = LoaderState(0, 1_000_000, 0, True, consumed=tuple(range(0, 1_000_000, 3))).to_dict()
    assert len(state["consumed_bitmap"]) == 125_000
    assert LoaderState.from_dict(state).consumed == tuple(range(0, 1_000_000, 3))
    with pytest.raises(ValueError, match="unknown keys"):
        LoaderState.from_dict({**state, "bogus": 1})
    with pytest.raises(ValueError, match="missing keys"):
        LoaderState.from_dict({k: v for k, v in state.items() if k != "epoch"})
    loader = _loader(True)
    with pytest.raises(ValueError, match="samples"):
        loader.load_state_dict(LoaderState(0, 5, 5, True).to_dict())
