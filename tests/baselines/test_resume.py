"""Exactly-once mid-epoch resume, torchdata-style: run k steps, save, restore fresh, drain.

With the same world size the restored loader yields exactly the batches an
uninterrupted run would have yielded after step k; at another world size the samples
still owed are re-planned, and the union is still every sample exactly once.
"""

from __future__ import annotations

import pytest

import odb
from baselines import build_loader
from baselines.length_cache import build
from harness.ranks import run_ranks
from tests.baselines.toy import ToyDataset

N, BUDGET, EPOCH = 53, 256, 1


def _loader(method: str = "gmt"):
    dataset = ToyDataset(N)
    options = {"cutoff_len": 128} if method in ("standard", "sorted") else {}
    lengths = build(dataset) if method != "standard" else None
    return build_loader(method, dataset, BUDGET, lengths=lengths, seed=3, **options)


def _drain(loader) -> list[tuple[int, ...]]:
    return [odb.pop_step_info(b).sample_ids for b in loader]


def _first_part(loader, k: int) -> tuple[list, dict]:
    loader.set_epoch(EPOCH)
    seen = []
    if k:
        for batch in loader:  # a batch counts as consumed once the loop receives it
            seen.append(odb.pop_step_info(batch).sample_ids)
            if len(seen) == k:
                break
    return seen, loader.state_dict()


def _template(rank: int, world_size: int, method: str, k: int) -> dict:
    reference = _loader(method)
    reference.set_epoch(EPOCH)
    full = _drain(reference)
    before, state = _first_part(_loader(method), k)
    restored = _loader(method)
    restored.load_state_dict(state)
    restored.set_epoch(EPOCH)  # the usual loop calls it; the restored epoch is kept
    after = _drain(restored)
    return {
        "full": full,
        "before": before,
        "after": after,
        "state": state,
        "steps": restored.stats()["steps"],
    }


@pytest.mark.parametrize("method", ["standard", "sorted", "gmt", "bmt", "packing"])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_resume_single_process_replays_the_remaining_batches(method: str, k: int) -> None:
    r = _template(0, 1, method, k)
    assert r["before"] == r["full"][:k]
    assert r["after"] == r["full"][k:]


@pytest.mark.dist
def test_resume_two_ranks_is_exactly_once_and_identical() -> None:
    results = run_ranks(_template, 2, "gmt", 3, timeout=60)
    ids = []
    for r in results:
        assert r["before"] + r["after"] == r["full"]
        assert r["steps"] == len(r["full"]) - 3
        ids += [i for step in r["before"] + r["after"] for i in step]
    assert sorted(ids) == list(range(N))
    pieces = [r["state"] for r in results]
    assert [p["rank"] for p in pieces] == [0, 1]
    # Elastic: the two-rank pieces restored on one rank re-plan what is still owed.
    single = _loader("gmt")
    single.load_state_dict(pieces[::-1])
    single.set_epoch(EPOCH)
    rest = [i for step in _drain(single) for i in step]
    before = [i for r in results for step in r["before"] for i in step]
    assert sorted(before + rest) == list(range(N))
    assert single.progress() == 1.0


def _rank0_only(rank: int, world_size: int) -> dict | None:
    """Rank 0 alone takes its piece mid-epoch; a collective there would hang rank 0."""
    loader = _loader("bmt")
    loader.set_epoch(EPOCH)
    piece = None
    for step, _ in enumerate(loader, start=1):
        if step == 2 and rank == 0:
            piece = loader.state_dict()
    return piece


@pytest.mark.dist
def test_rank0_only_piece_is_whole() -> None:
    piece = run_ranks(_rank0_only, 2, timeout=60)[0]
    assert piece["rank"] == 0 and piece["world_size"] == 2
    single = _loader("bmt")
    single.load_state_dict(piece)  # any one piece of a baseline is the whole state
    single.set_epoch(EPOCH)
    rest = sorted(i for step in _drain(single) for i in step)
    assert len(rest) < N and single.progress() == 1.0


def test_pieces_of_different_saves_are_refused() -> None:
    before, early = _first_part(_loader(), 1)
    loader = _loader()
    _first_part(loader, 2)
    late = loader.state_dict()
    with pytest.raises(ValueError, match="disagree"):
        _loader().load_state_dict([early, dict(late, rank=1)])
    with pytest.raises(TypeError, match="non-empty list"):
        _loader().load_state_dict([])


def test_state_after_the_last_step_positions_the_next_epoch() -> None:
    loader = _loader()
    loader.set_epoch(EPOCH)
    _drain(loader)
    state = loader.state_dict()
    fresh = _loader()
    fresh.load_state_dict(state)
    assert fresh.epoch == EPOCH + 1
    nxt = _loader()
    nxt.set_epoch(EPOCH + 1)
    assert _drain(fresh) == _drain(nxt)


def test_state_is_strict() -> None:
    state = _loader().state_dict()
    with pytest.raises(ValueError, match="unknown keys"):
        _loader().load_state_dict(dict(state, extra=1))
    with pytest.raises(ValueError, match="'gmt' loader"):
        _loader("bmt").load_state_dict(state)
    other = build_loader("gmt", ToyDataset(N), BUDGET, lengths=build(ToyDataset(N)), seed=4)
    with pytest.raises(ValueError, match="seed=3"):
        other.load_state_dict(state)


def test_changed_plan_settings_re_plan_what_is_still_owed() -> None:
    before, state = _first_part(_loader(), 2)
    dataset = ToyDataset(N)
    changed = build_loader("gmt", dataset, BUDGET + 64, lengths=build(dataset), seed=3)
    changed.load_state_dict(state)
    rest = [i for step in _drain(changed) for i in step]
    assert sorted([i for step in before for i in step] + rest) == list(range(N))
