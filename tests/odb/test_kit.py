"""The public surface: ``odb.__all__`` for a training loop, ``odb.kit`` for other loaders."""

from __future__ import annotations

import doctest

import pytest

import odb
import odb.kit
from harness.ranks import run_ranks
from harness.scenarios import LengthDataset


def test_the_user_api_is_small_and_apart_from_the_kit() -> None:
    assert len(odb.__all__) <= 20, odb.__all__
    assert not set(odb.__all__) & set(odb.kit.__all__)


def test_every_public_name_exists() -> None:
    missing = [n for n in odb.__all__ if not hasattr(odb, n)]
    missing += [f"kit.{n}" for n in odb.kit.__all__ if not hasattr(odb.kit, n)]
    assert not missing, missing


def test_the_kit_docstring_example_runs() -> None:
    assert doctest.testmod(odb.kit).failed == 0


def test_odbs_loader_and_every_baseline_are_resumable_loaders() -> None:
    import baselines

    assert isinstance(odb.ODBLoader(LengthDataset([3, 4]), token_budget=8,
                                    collate_mode="thread"), odb.kit.ResumableLoader)  # fmt: skip
    for method in baselines.METHODS:
        if method == "odb":
            continue
        fixed = {"cutoff_len": 8} if method in ("standard", "sorted") else {}
        lengths = [3, 4, 5] if baselines.needs_lengths(method) else None
        loader = baselines.build_loader(method, LengthDataset([3, 4, 5]), 16,
                                        lengths=lengths, **fixed)  # fmt: skip
        assert isinstance(loader, odb.kit.ResumableLoader), method


def _resume_through_gathered_state(rank: int, world_size: int) -> list[int]:
    """Two steps, a gathered save, a new loader restored from it: the rest of the epoch."""
    data = LengthDataset([(i * 7) % 23 + 2 for i in range(40)])
    first = odb.ODBLoader(data, token_budget=32, collate_mode="thread")
    batches = iter(first)
    seen = [i for _ in range(2) for i in odb.pop_step_info(next(batches)).sample_ids]
    saved = odb.kit.GatheredState(first).state_dict()
    assert len(saved["pieces"]) == world_size
    batches.close()
    second = odb.ODBLoader(data, token_budget=32, collate_mode="thread")
    odb.kit.GatheredState(second).load_state_dict(saved)
    return seen + [i for b in second for i in odb.pop_step_info(b).sample_ids]


@pytest.mark.dist
def test_a_gathered_state_resumes_the_epoch_exactly_once() -> None:
    per_rank = run_ranks(_resume_through_gathered_state, 2, timeout=120)
    assert sorted(i for ids in per_rank for i in ids) == list(range(40))


def test_a_gathered_state_refuses_what_it_cannot_drive() -> None:
    with pytest.raises(TypeError, match="state_dict\\(\\) and load_state_dict\\(\\)"):
        odb.kit.GatheredState(object())
    loader = odb.ODBLoader(LengthDataset([3]), token_budget=8, collate_mode="thread")
    with pytest.raises(ValueError, match="a dict with 'pieces'"):
        odb.kit.GatheredState(loader).load_state_dict([loader.state_dict()])
