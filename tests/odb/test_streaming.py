"""Streams (IterableDataset): identity coverage, quota closure, resume by position."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import odb
from harness.ranks import run_ranks
from harness.scenarios import LengthDataset

LENGTHS = [(i * 41) % 180 + 1 for i in range(83)]
OPTIONS = dict(token_budget=256, buffer_budgets=2, queue_depth=2, align_timeout_s=60.0, shard="odb")


class LengthStream(IterableDataset):
    """A stream of samples; its item ``p`` carries ``p`` so the test can check identity.

    Each item takes ``delay_s`` to make. With ``wait_for``, the first item waits until
    that file exists (another rank's stream has ended); with ``ended``, the stream
    creates that file when it is read past its last item.
    """

    def __init__(
        self,
        lengths: list[int],
        delay_s: float = 0.0,
        wait_for: str | None = None,
        ended: str | None = None,
    ) -> None:
        self.lengths = lengths
        self.delay_s = delay_s
        self.wait_for = wait_for
        self.ended = ended

    def __iter__(self):
        for position, length in enumerate(self.lengths):
            if position == 0 and self.wait_for is not None:
                _wait_for_file(self.wait_for)
            time.sleep(self.delay_s)
            ids = torch.arange(length) % 50 + 3
            yield {"input_ids": ids, "labels": ids.clone(), "index": torch.tensor([position])}
        if self.ended is not None:
            Path(self.ended).touch()


def _wait_for_file(path: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit_s} s")
        time.sleep(0.01)


def _epochs(
    rank: int, world_size: int, mode: str, workers: int, join: bool, epochs: int,
    slow_rank: int = -1, gate: str | None = None,
):
    """Every epoch's steps (sample ids), carry and samples read ahead.

    ``slow_rank``'s stream is slow; with ``gate`` (a path), it also holds back its first
    sample until every other rank's stream has been read to its end, which rank 0 can
    only do by reading ahead while it waits for the slow rank's first status.
    """
    slow = rank == slow_rank
    stream = LengthStream(
        LENGTHS,
        delay_s=0.01 if slow else 0.0,
        wait_for=gate if slow and gate else None,
        ended=None if slow or not gate else gate,
    )
    loader = odb.ODBLoader(stream, collate_mode=mode, num_workers=workers, join=join, **OPTIONS)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        steps = []
        for batch in loader:
            info = odb.pop_step_info(batch)
            assert list(info.sample_ids) == ([] if info.idle else batch["index"].tolist())
            steps.append(list(info.sample_ids))
        stats = loader.stats()
        out.append((steps, stats["carried"], stats["read_ahead"]))
    return out


def _check_join(per_rank) -> None:
    for epoch in range(len(per_rank[0])):
        steps = [r[epoch][0] for r in per_rank]
        assert len({len(s) for s in steps}) == 1, "step counts differ across ranks"
        assert sorted(i for s in steps for g in s for i in g) == list(range(len(LENGTHS)))


def test_stream_single_process() -> None:
    _check_join([_epochs(0, 1, "thread", 0, True, 2)])


@pytest.mark.dist
@pytest.mark.parametrize(("world_size", "mode", "workers"), [(2, "thread", 2), (3, "process", 2)])
def test_stream_join_identity_coverage(world_size: int, mode: str, workers: int) -> None:
    _check_join(run_ranks(_epochs, world_size, mode, workers, True, 2, timeout=180))


@pytest.mark.dist
@pytest.mark.parametrize("slow_rank", [-1, 1])
def test_stream_non_join_quota_closure(slow_rank: int, tmp_path: Path) -> None:
    """Every stream sample once per epoch or carried, never lost; also when rank 0 waits
    for a slow rank 1 and reads its stream ahead meanwhile (those samples are carried as
    samples when the epoch ends first).

    Rank 1 holds back its first sample until rank 0's stream has been read to its end:
    its first report needs a few samples, and its DataLoader worker runs at most 2 items
    ahead of what rank 0 takes, so rank 0 has read ahead, in every interleaving, before
    rank 1 reports.
    """
    gate = str(tmp_path / "rank0-read-all") if slow_rank == 1 else None
    per_rank = run_ranks(_epochs, 2, "thread", 1, False, 3, slow_rank, gate, timeout=180)
    if slow_rank == 1:
        assert per_rank[0][0][2] > 0, "rank 0 read nothing ahead in epoch 0"
    carried_before = 0
    for epoch in range(3):
        steps = [r[epoch][0] for r in per_rank]
        assert len({len(s) for s in steps}) == 1
        emitted = [i for s in steps for g in s for i in g]
        assert len(emitted) == len(set(emitted)), "a sample was emitted twice in an epoch"
        carried = sum(r[epoch][1] for r in per_rank)
        # Stream positions of this epoch are fresh samples; carried ones come first.
        assert len(emitted) + carried == len(LENGTHS) + carried_before
        carried_before = carried


def _resume_part(rank: int, world_size: int, k: int, state: list[dict] | None):
    loader = odb.ODBLoader(LengthStream(LENGTHS), collate_mode="thread", **OPTIONS)
    loader.set_epoch(0)
    if state is not None:
        loader.load_state_dict(state)
    seen = []
    for step, batch in enumerate(loader):
        seen += odb.pop_step_info(batch).sample_ids
        if step + 1 == k:
            break
    return seen, loader.state_dict()


@pytest.mark.dist
@pytest.mark.parametrize("new_world", [2, 3])
def test_stream_resume_exactly_once(new_world: int) -> None:
    before = run_ranks(_resume_part, 2, 4, None, timeout=120)
    pieces = [state for _, state in before]  # every rank's own piece
    after = run_ranks(_resume_part, new_world, -1, pieces, timeout=120)
    emitted = [i for ids, _ in before + after for i in ids]
    assert sorted(emitted) == list(range(len(LENGTHS)))


def test_stream_progress_is_refused_and_estimate_uses_last_epoch() -> None:
    loader = odb.ODBLoader(LengthStream(LENGTHS), collate_mode="thread", **OPTIONS)
    with pytest.raises(TypeError, match="stream"):
        loader.progress()
    assert loader.estimate_steps() is None
    steps = sum(1 for _ in loader)
    assert loader.estimate_steps() == steps


def test_map_style_estimate_is_exact_at_epoch_end() -> None:
    loader = odb.ODBLoader(LengthDataset(LENGTHS), collate_mode="thread", **OPTIONS)
    estimates, steps = [], 0
    for _ in loader:
        steps += 1
        estimates.append(loader.estimate_steps())
    assert estimates[-1] == steps and loader.progress() == 1.0


def test_wrap_refuses_persistent_workers() -> None:
    dl = DataLoader(LengthDataset(LENGTHS), batch_size=1, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        odb.wrap(dl, token_budget=256)


def _stream_part(k: int, join: bool, state: dict | None) -> tuple[list[int], dict, int]:
    loader = odb.ODBLoader(LengthStream(LENGTHS), collate_mode="thread", join=join, **OPTIONS)
    if state is not None:
        loader.load_state_dict(state)
    seen = []
    if k != 0:
        for step, batch in enumerate(loader, start=1):
            seen += odb.pop_step_info(batch).sample_ids
            if step == k:
                break
    return seen, loader.state_dict(), loader.stats().get("carried", 0)


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("k", [0, 1, 7, -1])
def test_stream_resume_template(k: int, join: bool) -> None:
    """k steps (k=-1: the whole epoch), save, restore into a fresh loader, drain."""
    before, state, _ = _stream_part(k, join, None)
    after, _, carried = _stream_part(-1, join, state)
    if k == -1:  # a state taken after the last step positions the loader at the next epoch
        if join:
            assert sorted(before) == sorted(after) == list(range(len(LENGTHS)))
        return
    emitted = before + after
    assert len(emitted) == len(set(emitted)), "a stream position was yielded twice"
    if join:
        assert sorted(emitted) == list(range(len(LENGTHS)))
    else:
        assert len(emitted) + carried == len(LENGTHS), "quota closure broken across the resume"
