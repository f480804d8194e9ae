"""``bench.repeat_tests`` tallies each test's outcome over real, repeated pytest runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.repeat_tests import main

FLAKY = """
import os, pathlib, pytest

def test_always():
    assert True

def test_second_run_fails():
    marker = pathlib.Path(os.environ["REPEAT_MARKER"])
    first = not marker.exists()
    marker.touch()
    assert first

@pytest.mark.skip(reason="never runs")
def test_skipped():
    pass
"""


# Real pytest runs, one interpreter each (~3 s idle); the quick tier keeps the next test.
@pytest.mark.slow
def test_counts_outcomes_per_test_over_repeats(tmp_path: Path, monkeypatch) -> None:
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(FLAKY)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    out = tmp_path / "result.json"
    code = main([str(test_file), "--times", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    assert code == 1 and result["repeats_run"] == 3 and not result["all_passed_every_time"]
    by_name = {k.rsplit("::", 1)[1]: v for k, v in result["per_test"].items()}
    assert by_name["test_always"]["passed"] == 3
    assert by_name["test_second_run_fails"] == dict(passed=1, failed=2, error=0, skipped=0)
    assert by_name["test_skipped"]["skipped"] == 3


def test_stop_on_failure_ends_at_first_red_run(tmp_path: Path, monkeypatch) -> None:
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(FLAKY)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    out = tmp_path / "result.json"
    assert main([str(test_file), "--times", "5", "--stop-on-failure", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["repeats_run"] == 2
