"""The measurements, the pairing, the cell format and the claim rule of ``paper.common``,
on hand-written numbers (independent of the fixtures and the golden tables)."""

from __future__ import annotations

import pytest

from paper.claims import Comparison, Spread, compare, measurements, paired_ratios, pairings, verdict
from paper.common import Collected, Run


def _run(name: str = "r", timings: list[tuple[float, int]] | None = None, **cell) -> Run:
    """A run whose epochs took ``timings`` = [(wall_s, samples), ...]; no field when None."""
    result = {"throughput_samples_per_s": 5.0}
    if timings is not None:
        result["epoch_timings"] = [
            {"epoch": k, "wall_s": wall, "samples": n, "steps": 1}
            for k, (wall, n) in enumerate(timings)
        ]
    return Run(name, cell, result)


# -- the claim rule ----------------------------------------------------------------------


def test_every_ratio_above_one_is_faster() -> None:
    assert verdict([1.02, 1.3, 1.1]) == "faster"
    assert verdict([1.5, 1.4, 1.6, 1.01, 1.2]) == "faster"


def test_every_ratio_below_one_is_slower() -> None:
    assert verdict([0.9, 0.95, 0.7]) == "slower"


def test_ratios_that_straddle_one_are_within_noise() -> None:
    assert verdict([1.2, 0.98, 1.1]) == "within noise"
    assert verdict([1.0, 1.0, 1.0]) == "within noise"  # no ratio beats 1
    assert verdict([2.0, 2.1, 1.0]) == "within noise"


def test_fewer_than_three_pairings_never_give_a_direction() -> None:
    assert verdict([1.5, 1.6]) == "too few measurements (n=2)"
    assert verdict([0.5]) == "too few measurements (n=1)"
    assert verdict([]) == "too few measurements (n=0)"


# -- measurements: the warm-up epoch is dropped ----------------------------------------


def test_the_first_timed_epoch_is_a_warm_up_and_is_dropped() -> None:
    run = _run(timings=[(10.0, 8), (4.0, 8), (2.0, 8), (8.0, 8)])
    assert measurements(run) == [2.0, 4.0, 1.0]  # 8/4, 8/2, 8/8; 8/10 dropped


def test_two_timed_epochs_give_one_measurement() -> None:
    assert measurements(_run(timings=[(10.0, 8), (4.0, 6)])) == [1.5]


def test_a_run_that_timed_fewer_than_two_epochs_gives_its_whole_run_figure() -> None:
    assert measurements(_run()) == [5.0]  # an older result: no epoch_timings
    assert measurements(_run(timings=[])) == [5.0]  # resumed mid-epoch: none whole
    assert measurements(_run(timings=[(3.0, 9)])) == [5.0]  # one epoch: the warm-up only


def test_an_epoch_without_time_is_refused() -> None:
    with pytest.raises(ValueError, match="epoch 2 has wall_s 0"):
        measurements(_run("bad", timings=[(1.0, 8), (1.0, 8), (0.0, 8)]))


# -- pairing by position -----------------------------------------------------------------


def test_pairs_epoch_k_with_epoch_k_as_far_as_both_go() -> None:
    assert paired_ratios([4.0, 9.0, 5.0, 7.0], [2.0, 3.0, 10.0]) == [2.0, 3.0, 0.5]
    assert paired_ratios([4.0], [2.0, 3.0, 10.0]) == [2.0]


def test_each_seed_pairs_with_its_own_reference() -> None:
    cell = {"data": "d", "method": "odb", "seed": 0, "options": {}, "budget": 1}
    runs = [
        _run("odb0", [(1.0, 1), (1.0, 4), (1.0, 6)], **cell),
        _run("odb1", [(1.0, 1), (1.0, 9), (1.0, 3)], **{**cell, "seed": 1}),
        _run("std0", [(1.0, 1), (1.0, 2), (1.0, 2)], **{**cell, "method": "standard"}),
        _run("std1", [(1.0, 1), (1.0, 3), (1.0, 1)], **{**cell, "method": "standard", "seed": 1}),
    ]
    got = Collected({}, runs, [])
    seeds = runs[:2]
    assert pairings(seeds, lambda r: got.counterpart(r, method="standard")) == [2.0, 3.0, 3.0, 3.0]
    c = compare(seeds, lambda r: got.counterpart(r, method="standard"))
    assert (c.cell(), c.verdict) == ("3.00x [2.00-3.00] n=4", "faster")
    assert compare(runs[2:3], lambda r: got.counterpart(r, method="standard")).is_reference


# -- the cell format ---------------------------------------------------------------------


def test_one_format_for_every_timing_and_ratio() -> None:
    assert Spread.of([2.24, 1.98, 2.10]).format(2, "x") == "2.10x [1.98-2.24] n=3"
    assert Spread.of([2.1]).format(2, "x") == "2.10x (n=1)"
    assert Spread.of([4.0, 6.0]).format() == "5.00 [4.00-6.00] n=2"
    assert Spread.of([]).format() == "–"
    assert Spread.of([3.0, 1.0, 2.0]).to_dict() == {"median": 2.0, "low": 1.0, "high": 3.0, "n": 3}
    assert Comparison((0.9, 1.1, 1.0)).to_dict() == {
        "median": 1.0,
        "low": 0.9,
        "high": 1.1,
        "n": 3,
        "verdict": "within noise",
    }
