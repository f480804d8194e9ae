"""Exactly-once mid-epoch resume, torchdata-style: run k steps, save, restore fresh, drain.

The union of ids yielded before the checkpoint and after the restore must be the
epoch's full id multiset (join) — or, in non-join mode, the epoch's ids minus the carry
it hands to the next epoch — with no duplicates, also when the world size changes.
"""

from __future__ import annotations

import pytest

import odb
from odb.resume import LoaderState
from tests.dist import run_ranks
from tests.odb.scenarios import LengthDataset

LENGTHS = [(i * 29) % 150 + 1 for i in range(97)]
OPTIONS = dict(
    token_budget=256,
    window_budgets=2,
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


def _second_part(rank: int, world_size: int, state: dict, join: bool) -> tuple[list[int], int]:
    loader = _loader(join)
    loader.load_state_dict(state)
    loader.set_epoch(1)
    seen = [i for b in loader for i in odb.pop_step_info(b).sample_ids]
    return seen, loader.stats()["carried"]


def _check(before: list, after: list, join: bool) -> None:
    first = [i for ids, _, _ in before for i in ids]
    second = [i for ids, _ in after for i in ids]
    carried = sum(c for _, c in after)
    emitted = first + second
    assert len(emitted) == len(set(emitted)), "an id was yielded twice"
    if join:
        assert sorted(emitted) == list(range(len(LENGTHS)))
    else:
        assert len(emitted) + carried == len(LENGTHS), "quota closure broken across the resume"


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_single_process(k: int, join: bool) -> None:
    before = [_first_part(0, 1, k, join)]
    after = [_second_part(0, 1, before[0][1], join)]
    _check(before, after, join)


def test_resume_after_last_step_positions_next_epoch() -> None:
    seen, state, steps = _first_part(0, 1, -1, True)
    assert sorted(seen) == list(range(len(LENGTHS))) and LoaderState.from_dict(state).epoch_done
    loader = _loader(True)
    loader.load_state_dict(state)
    assert loader.epoch == 2
    assert sorted(i for b in loader for i in odb.pop_step_info(b).sample_ids) == list(
        range(len(LENGTHS))
    )


@pytest.mark.dist
@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_two_ranks(k: int, join: bool) -> None:
    before = run_ranks(_first_part, 2, k, join, timeout=120)
    assert before[0][1] == before[1][1], "state_dict must be identical on every rank"
    after = run_ranks(_second_part, 2, before[0][1], join, timeout=120)
    _check(before, after, join)


@pytest.mark.dist
@pytest.mark.parametrize("new_world", [1, 3])
def test_elastic_resume(new_world: int) -> None:
    before = run_ranks(_first_part, 2, 5, True, timeout=120)
    after = run_ranks(_second_part, new_world, before[0][1], True, timeout=120)
    _check(before, after, True)


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
