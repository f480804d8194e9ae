"""odb.plan: the forecast equals the real loader's epoch, the advice, bad arguments."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch

import odb
from harness.ranks import run_ranks
from harness.scenarios import LengthDataset
from odb.planning.forecast import StepCost
from tests.odb.planning.loader_figures import FIGURES, epoch_figures, summed

SCHEMA = json.loads((Path(odb.__file__).parent / "planning" / "report.schema.json").read_text())


def spread_lengths(n: int, seed: int) -> list[int]:
    """Long-tailed lengths (CV about 1), as chat data has."""
    rng = random.Random(seed)
    return [int(min(3000, rng.lognormvariate(5.0, 0.9))) + 1 for _ in range(n)]


def _row(report: odb.planning.PlanReport, budget: int, world_size: int) -> dict:
    return next(r for r in report.rows if r["budget"] == budget and r["world_size"] == world_size)


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_the_forecast_is_the_real_loaders_epoch(mode: str) -> None:
    datasets = {"spread": spread_lengths(240, 0), "short": [rng % 40 + 8 for rng in range(97)]}
    options = {"token_budget": 2048, "collate_mode": mode, "seed": 3, "buffer_budgets": 8}
    for world_size in (1, 2):
        per_rank = run_ranks(epoch_figures, world_size, datasets, options, timeout=120)
        for name, lengths in datasets.items():
            report = odb.plan(
                LengthDataset(lengths),
                budgets=[2048],
                world_sizes=[world_size],
                num_samples=None,
                progress=False,
                seed=3,
                buffer_budgets=8,
            )
            row = _row(report, 2048, world_size)
            assert {k: row[k] for k in FIGURES} == summed([r[name] for r in per_rank]), name


def test_identical_lengths_get_the_plain_answer() -> None:
    report = odb.plan(
        LengthDataset([64] * 300), world_sizes=[1, 2], num_samples=None, progress=False
    )
    assert not report.worth_it
    verdict = [w for w in report.warnings if w.startswith("ODB will not help")]
    assert len(verdict) == 1 and "nearly identical (CV 0.00" in verdict[0]
    assert all(r["speedup_vs_standard"] == pytest.approx(1.0, abs=0.02) for r in report.rows)


def test_spread_lengths_pay_and_the_report_validates() -> None:
    report = odb.plan(
        LengthDataset(spread_lengths(400, 1)),
        budgets=[4096, 8192, 16384],
        world_sizes=[1, 4],
        progress=False,
    )
    jsonschema.validate(json.loads(json.dumps(report.to_dict())), SCHEMA)
    assert report.worth_it and report.warnings == []
    assert set(report.recommendation) == {1, 4}
    for world_size, advice in report.recommendation.items():
        rows = [r for r in report.rows if r["world_size"] == world_size]
        best = min(r["epoch_cost"] for r in rows)
        chosen = _row(report, advice["budget"], world_size)
        assert chosen["epoch_cost"] <= best / 0.98  # within 2 % of the best throughput
        smaller = [r for r in rows if r["budget"] < advice["budget"]]
        assert all(r["epoch_cost"] > best / 0.98 for r in smaller)  # and the smallest such
    assert all(r["speedup_vs_standard"] > 1.2 for r in report.rows)
    assert "budget" in report.table() and "recommended at 4 rank(s)" in report.table()


def test_the_step_cost_decides_the_budget() -> None:
    data = LengthDataset(spread_lengths(400, 2))
    tokens_only = odb.plan(
        data, budgets=[2048, 16384], world_sizes=[1], progress=False, step_cost=StepCost(0, 1)
    )
    per_step = odb.plan(
        data, budgets=[2048, 16384], world_sizes=[1], progress=False, step_cost=StepCost(50_000, 1)
    )
    # Tokens alone: the smaller budget pads less. A large fixed cost per step: fewer steps.
    assert tokens_only.recommendation[1]["budget"] == 2048
    assert per_step.recommendation[1]["budget"] == 16384
    assert per_step.step_cost == {"a": 50_000, "b": 1, "source": "given"}


def test_oversize_and_idle_are_warned() -> None:
    lengths = [5000] + [3000] * 8  # one rank has two steps, the others one sample each
    report = odb.plan(LengthDataset(lengths), budgets=[4096], world_sizes=[8], progress=False)
    text = " ".join(report.warnings)
    assert "1 measured samples are longer than the budget" in text
    assert "IDLE steps are" in text and "at 8 ranks" in text


def test_a_sample_is_measured_and_scaled() -> None:
    report = odb.plan(
        LengthDataset(spread_lengths(500, 3)),
        num_samples=100,
        world_sizes=[1],
        budgets=[4096],
        progress=False,
    )
    assert (report.measured, report.dataset_size, report.epoch_scale) == (100, 500, 5.0)
    assert any("100 of 500 samples measured" in a for a in report.assumptions)


def test_reading_stops_at_the_time_cap() -> None:
    report = odb.plan(
        LengthDataset(spread_lengths(300, 4), work=3),
        num_samples=None,
        time_limit_s=0.05,
        world_sizes=[1],
        budgets=[4096],
        progress=False,
    )
    assert report.stopped_by_time and 0 < report.measured < 300


def test_the_progress_line_counts_samples(capsys: pytest.CaptureFixture) -> None:
    odb.plan(LengthDataset([10] * 50), world_sizes=[1], budgets=[64])
    assert "odb.plan: measured 50/50 samples" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"world_sizes": []}, ValueError, "world_sizes is empty"),
        ({"world_sizes": [0]}, ValueError, "world_sizes item must be >= 1"),
        ({"budgets": []}, ValueError, "budgets is empty"),
        ({"budgets": [2.5]}, TypeError, "budgets item"),
        ({"num_samples": 0}, ValueError, "num_samples must be >= 1"),
        ({"time_limit_s": 0}, ValueError, "time_limit_s must be > 0"),
        ({"cutoff": -1}, ValueError, "cutoff must be >= 1"),
        ({"probe": 3}, TypeError, "step_fn"),
        ({"policy": "fastest"}, ValueError, "policy"),
        ({"token_budgte": 5}, TypeError, "token_budget"),
        (
            {"step_cost": None, "config": odb.ODBConfig(token_budget=8), "seed": 1},
            TypeError,
            "not both",
        ),
    ],
)
def test_bad_arguments_are_refused_before_reading(kwargs, error, words) -> None:
    class Unreadable(LengthDataset):
        def __getitem__(self, index):
            raise AssertionError("read before the arguments were checked")

    with pytest.raises(error, match=words):
        odb.plan(Unreadable([10] * 5), progress=False, **kwargs)


def test_not_a_dataset_is_refused() -> None:
    with pytest.raises(TypeError, match="map-style dataset"):
        odb.plan(iter([1, 2]), progress=False)
    with pytest.raises(ValueError, match="empty dataset"):
        odb.plan(LengthDataset([]), progress=False)


def test_the_probe_refuses_clearly_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the probe runs")
    report = odb.plan(
        LengthDataset([10, 20, 30]),
        world_sizes=[1],
        budgets=[64],
        progress=False,
        probe=lambda batch: None,
    )
    assert report.probe["ran"] is False and "no CUDA device" in report.probe["reason"]
    assert any(w.startswith("memory not probed: no CUDA device") for w in report.warnings)
    jsonschema.validate(json.loads(json.dumps(report.to_dict())), SCHEMA)
