"""The recipe's learning-rate shape and its scheduler over training progress."""

import warnings

import pytest
import torch

from experiments.train.config import OptimConfig
from experiments.train.schedule import build_scheduler, lr_factor


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_warmup_then_decay_to_the_floor_exactly_at_the_end(kind: str) -> None:
    assert lr_factor(0.0, kind, 0.1, 0.2) == 0.0
    assert lr_factor(0.05, kind, 0.1, 0.2) == pytest.approx(0.5)
    assert lr_factor(0.1, kind, 0.1, 0.2) == pytest.approx(1.0)
    assert lr_factor(1.0, kind, 0.1, 0.2) == pytest.approx(0.2)
    points = [lr_factor(0.1 + 0.9 * i / 50, kind, 0.1, 0.2) for i in range(51)]
    assert all(a >= b for a, b in zip(points, points[1:], strict=False))


def test_constant_and_clamping() -> None:
    assert lr_factor(0.7, "constant", 0.0, 0.0) == 1.0
    assert lr_factor(1.5, "cosine", 0.0, 0.0) == lr_factor(1.0, "cosine", 0.0, 0.0) == 0.0
    assert lr_factor(-1.0, "linear", 0.1, 0.0) == 0.0


def test_scheduler_sets_every_group_from_progress_before_the_first_optimizer_step() -> None:
    """The loop steps the scheduler before each window, the first one included: no
    warning about the order, every group at the shape's rate, nothing to restore but
    the progress."""
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=1e-3)
    done = [0.0]
    cfg = OptimConfig(lr=1e-3, schedule="linear", warmup_ratio=0.0, min_lr_ratio=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler = build_scheduler(optimizer, cfg, lambda: done[0])
        done[0] = 0.25
        scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(7.5e-4)] * 2
    assert scheduler.get_last_lr() == [pytest.approx(7.5e-4)] * 2
    done[0] = 1.0
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, 0.0]
