"""The progress-driven learning-rate schedule (pure)."""

import pytest

from experiments.train.schedule import ProgressSchedule, lr_factor


class _Optimizer:
    def __init__(self) -> None:
        self.param_groups = [{"lr": 0.0}, {"lr": 0.0}]


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


def test_schedule_sets_every_group_and_round_trips() -> None:
    opt = _Optimizer()
    schedule = ProgressSchedule(opt, 1e-3, "linear", 0.0, 0.0)
    assert schedule.update(0.25) == pytest.approx(7.5e-4)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(7.5e-4)] * 2
    state = schedule.state_dict()
    other = ProgressSchedule(_Optimizer(), 1e-3, "linear", 0.0, 0.0)
    other.load_state_dict(state)
    assert other.fraction == 0.25 and state == {"fraction": 0.25}
    with pytest.raises(ValueError, match="went backwards"):
        schedule.update(0.1)
    with pytest.raises(ValueError, match="unknown schedule state"):
        other.load_state_dict({"fraction": 0.5, "step": 3})
