"""Training curves (`experiments.train.curves`), read back with tensorboard's own event
reader (what ``tensorboard --logdir`` reads).

The module alone on a temporary folder: one point per step and scalar, a resumed
segment's points replacing those written past its checkpoint, nothing left open on any
way out. Then one real W=2 run through the entry point: a point per optimizer step for
each scalar, the result's losses and learning rates, and IDLE micro-steps and padding
efficiency summed over both ranks, as the ranks' sample logs count them.
"""

import json
import threading
from pathlib import Path

import psutil
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.train.curves import CURVES_DIR, TAGS, Curves, StepPoint
from tests.experiments.train.test_run import train


def read_curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every point of every scalar in ``folder``: ``{tag: [(step, value), ...]}``."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep all
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _point(step: int, **figures: float) -> StepPoint:
    return StepPoint(**{"step": step, "loss": 1.0, "lr": 1e-3, "real_tokens": 600,
                        "padded_tokens": 800, "idle_steps": 0, "wall_s": 2.0, **figures})


def test_a_point_holds_the_steps_figures() -> None:
    point = _point(3, loss=2.5, real_tokens=600, padded_tokens=800, idle_steps=2, wall_s=1.5)
    assert point.scalars() == {"train/loss": 2.5, "train/lr": 1e-3, "train/tokens_per_s": 400.0,
                               "train/padding_efficiency": 0.75, "train/idle_steps": 2.0}
    assert list(point.scalars()) == list(TAGS)


def test_every_step_has_one_point_of_each_scalar(tmp_path: Path) -> None:
    with Curves(tmp_path / CURVES_DIR) as curves:
        for step in (1, 2, 3):
            curves.add(_point(step, loss=1.0 / step, idle_steps=step - 1))
    scalars = read_curves(tmp_path / CURVES_DIR)
    assert sorted(scalars) == sorted(TAGS)
    assert all([s for s, _ in points] == [1, 2, 3] for points in scalars.values())
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [v for _, v in scalars["train/idle_steps"]] == [0.0, 1.0, 2.0]


def test_a_resumed_segment_replaces_the_points_past_its_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / CURVES_DIR
    # The first segment trained to step 5; its checkpoint was step 3. (Each Curves writes
    # its own file, read in name order: time, host, pid, then a per-process counter.)
    with Curves(folder) as first:
        for step in range(1, 6):
            first.add(_point(step, loss=10.0 + step))
    with Curves(folder, first_step=4) as resumed:
        for step in range(4, 7):
            resumed.add(_point(step, loss=20.0 + step))
    assert read_curves(folder)["train/loss"] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0),
                                           (5, 25.0), (6, 26.0)]


def test_closing_leaves_no_thread_or_open_file_also_after_an_error(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="a failing step"), \
            Curves(tmp_path / CURVES_DIR) as curves:
        curves.add(_point(1))
        assert set(threading.enumerate()) - before, "premise: the writer runs a thread"
        raise RuntimeError("a failing step")
    assert set(threading.enumerate()) <= before
    assert not [f.path for f in psutil.Process().open_files() if f.path.startswith(str(tmp_path))]
    assert read_curves(tmp_path / CURVES_DIR)["train/loss"] == [(1, 1.0)]  # flushed on the way out
    curves.close()  # again: nothing to do
    with pytest.raises(RuntimeError, match="after close"):
        curves.add(_point(2))
    with pytest.raises(ValueError, match="first_step must be >= 1"):
        Curves(tmp_path / "other", first_step=0)


# 9 records, none held out, one whole epoch of Standard at W=2 (2 samples a batch: budget
# 2048 // cutoff 1024): rank 1 runs out of samples a step before rank 0 (an IDLE step).
# Points are exchanged every 2 steps and at the end.
WHOLE_EPOCH = ("data.max_samples=9", "data.holdout_samples=0", "optim.max_steps=0",
               "run.log_every=2", "run.record_sample_ids=true")


def _rows_by_step(out: Path) -> dict[int, list[dict]]:
    """Both ranks' sample-log rows of each loader step (= optimizer step: no accumulation)."""
    rows: dict[int, list[dict]] = {}
    for rank in (0, 1):
        for line in (out / f"samples_rank{rank}.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows.setdefault(row["step"], []).append(row)
    return rows


@pytest.mark.dist
@pytest.mark.slow
def test_a_run_writes_one_point_per_optimizer_step(base_config: Path, ultrachat_train,
                                                   tmp_path: Path) -> None:
    stale = tmp_path / CURVES_DIR / "events.out.tfevents.0.an-earlier-run"
    stale.parent.mkdir()
    stale.write_text("")
    result = train(base_config, tmp_path, "method/standard.yaml", overrides=WHOLE_EPOCH)
    assert not stale.exists(), "a fresh run keeps an earlier run's curves"
    assert result["tensorboard"] == str(tmp_path / CURVES_DIR)
    steps = list(range(1, result["optimizer_steps"] + 1))
    assert len(steps) >= 3 and result["idle_steps"] > 0, "premise: several steps, an IDLE one"
    scalars = read_curves(tmp_path / CURVES_DIR)
    assert {tag: [s for s, _ in scalars[tag]] for tag in TAGS} == dict.fromkeys(TAGS, steps)
    values = {tag: [v for _, v in points] for tag, points in scalars.items()}
    curve = result["loss_curve"]
    assert values["train/loss"] == pytest.approx([p["loss"] for p in curve], rel=1e-6)
    assert values["train/lr"] == pytest.approx([p["lr"] for p in curve], rel=1e-6)
    assert all(v > 0 for v in values["train/tokens_per_s"])
    rows = _rows_by_step(tmp_path)
    assert values["train/idle_steps"] == [sum(r["idle"] for r in rows[s]) for s in steps]
    real_steps = [s for s in steps if not any(r["idle"] for r in rows[s])]
    assert real_steps, "premise: a step without IDLE"
    # (an IDLE batch is a sample the log does not name: its padded size is unknown)
    for step in real_steps:
        efficiency = values["train/padding_efficiency"][step - 1]
        lengths = [[ultrachat_train.length(i) for i in r["ids"]] for r in rows[step]]
        padded = sum(len(rank) * max(rank) for rank in lengths)
        assert efficiency == pytest.approx(sum(map(sum, lengths)) / padded, rel=1e-6), step
