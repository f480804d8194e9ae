"""The torch-only pieces the adapters share: accumulation windows of a loader (resumable
exactly at a window boundary) and the progress-driven scheduler. One process, no
framework imported."""

from __future__ import annotations

import torch

import odb
from harness.scenarios import LengthDataset
from odb.integrations import ProgressLR, iter_windows

LENGTHS = [5 + (7 * i) % 40 for i in range(60)]


def _loader(accum: int = 3) -> odb.ODBLoader:
    return odb.ODBLoader(
        LengthDataset(LENGTHS),
        token_budget=64,
        grad_accum_steps=accum,
        collate_mode="thread",
        seed=3,
    )


def _ids(window) -> list[int]:
    return [i for info in window.infos for i in info.sample_ids]


def test_windows_cover_the_epoch_once_and_only_the_last_is_short() -> None:
    windows = list(iter_windows(_loader()))
    assert [len(w) for w in windows[:-1]] == [3] * (len(windows) - 1)
    assert 1 <= len(windows[-1]) <= 3
    assert sorted(i for w in windows for i in _ids(w)) == list(range(len(LENGTHS)))
    for w in windows:  # step info popped; one normaliser per window
        assert all(odb.STEP_INFO_KEY not in b for b in w.batches)
        assert {info.loss_normalizer for info in w.infos} == {w.loss_normalizer}
        assert w.loss_tokens == sum(info.global_loss_tokens for info in w.infos)
    assert windows[0].progress == 0.0
    assert [w.progress for w in windows] == sorted(w.progress for w in windows)


def test_state_after_a_window_resumes_with_exactly_the_rest() -> None:
    loader = _loader()
    windows = iter_windows(loader)
    seen = [i for _ in range(2) for i in _ids(next(windows))]
    state = loader.state_dict()  # nothing past the second window was taken
    windows.close()
    fresh = _loader()
    fresh.load_state_dict(state)
    rest = [i for w in iter_windows(fresh) for i in _ids(w)]
    assert sorted(seen + rest) == list(range(len(LENGTHS)))


def test_window_size_must_match_the_loader() -> None:
    try:
        next(iter_windows(_loader(accum=2), grad_accum_steps=3))
    except ValueError as exc:
        assert "grad_accum_steps=3" in str(exc) and "config.grad_accum_steps=2" in str(exc)
    else:
        raise AssertionError("a window size the loader does not use was accepted")


def test_progress_lr_follows_the_progress_however_often_it_steps() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    done = [0.0]
    sched = ProgressLR(optimizer, lambda f: 1.0 - f, progress=lambda: done[0])
    assert optimizer.param_groups[0]["lr"] == 2.0
    optimizer.step()
    done[0] = 0.25
    sched.step()
    sched.step()  # a wrapper stepping twice changes nothing
    assert optimizer.param_groups[0]["lr"] == 1.5
    done[0] = 1.3  # clipped to 1
    sched.step()
    assert optimizer.param_groups[0]["lr"] == 0.0
    state = sched.state_dict()
    assert "progress" not in state and "lr_lambdas" not in state
    restored = ProgressLR(optimizer, lambda f: 1.0 - f, progress=lambda: 0.5)
    restored.load_state_dict(state)
    restored.step()
    assert optimizer.param_groups[0]["lr"] == 1.0
