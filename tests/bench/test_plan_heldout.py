"""The held-out comparison: its constants are the UltraChat pair's, its rows all there."""

from __future__ import annotations

import pytest

from bench import plan_heldout
from odb.planning.step_cost import FITTED


def test_the_committed_constants_are_the_ultrachat_fit() -> None:
    refit = plan_heldout.fit()
    assert refit.peak_mfu == pytest.approx(FITTED.peak_mfu, abs=1e-4)
    assert refit.step_overhead_s == pytest.approx(FITTED.step_overhead_s, abs=1e-4)
    # the fit reproduces its own two data points and nothing else went into it
    assert set(plan_heldout.FIT_RATES) == {"standard", "odb"}
    for method, rate in plan_heldout.FIT_RATES.items():
        run = plan_heldout.paper_run("ultrachat", "8b", method)
        assert plan_heldout.rate(run, refit) == pytest.approx(rate, rel=1e-6)


def test_every_held_out_row_is_there() -> None:
    rows = plan_heldout.rows(FITTED)
    names = " / ".join(r["what"] for r in rows)
    for needle in (
        "llava 8B 8x H20 Standard",
        "llava 8B 8x H20 ODB",
        "sharegpt4o 8B 8x H20 ODB",
        "mmmix 2B 16x H20 Standard",
        "mmmix 2B 16x H20 ODB speed-up",
        "sharegpt4o 2B 8x H20 ODB speed-up",
        "Sorted speed-up",
        "GPU proxy sharegpt4o-shaped",
        "GPU proxy mmmix-shaped",
        "torchtitan",
    ):
        assert needle in names, needle
    assert not any("ultrachat" in r["what"] for r in rows)  # the fit's data is not a row
    for r in rows:
        assert r["error"] == pytest.approx(
            (r["predicted"] - r["published"]) / r["published"], abs=2e-3
        )
    assert "| row |" in plan_heldout.markdown(rows)
