"""The time budgets (tests/time_budget.py) on a small inner suite run by pytester.

The inner tests sleep 0.3 s against a budget of 0.2 s: `time.sleep` never returns early,
so "over the budget" holds on any machine, however loaded. Nothing here asserts that
anything is fast.
"""

from __future__ import annotations

import json
import re

import pytest

INNER = """
import time
import pytest

@pytest.fixture
def slow_setup():
    time.sleep(0.3)

def test_quick():
    pass

def test_sleeps():
    time.sleep(0.3)

def test_slow_in_its_fixture(slow_setup):
    pass

def test_fails_on_its_own():
    time.sleep(0.3)
    assert False, "its own failure"

@pytest.mark.time_budget(30, reason="an inner test with its own budget")
def test_exempt():
    time.sleep(0.3)
"""
LISTED = re.compile(
    r"^\s+(\d+\.\d) s  \(set-up (\d+\.\d) \+ call (\d+\.\d); budget 0\.2 s\)  "
    r"test_inner\.py::(\w+)$", re.M)
STRICT = re.compile(r"^test_inner\.py::(\w+) took (\d+\.\d) s .*over its 0\.2 s budget", re.M)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest("-p", "tests.time_budget", "-p", "no:cacheprovider", *args)


def test_over_budget_tests_pass_and_are_listed_with_their_seconds(
    pytester: pytest.Pytester,
) -> None:
    result = _run(pytester, "--test-budget-s=0.2")
    result.assert_outcomes(passed=4, failed=1)  # only the test with its own failure fails
    out = result.stdout.str()
    listed = {m[4]: [float(s) for s in m.groups()[:3]] for m in LISTED.finditer(out)}
    assert set(listed) == {"test_sleeps", "test_slow_in_its_fixture", "test_fails_on_its_own"}
    assert listed["test_sleeps"][2] >= 0.3  # the call's sleep
    assert listed["test_slow_in_its_fixture"][1] >= 0.3  # set-up counts
    assert "over their time budget: 3 (budgets x1.00, --budget-scale)" in out
    report = json.loads((pytester.path / ".test-budget.json").read_text())
    assert {r["test"].split("::")[1] for r in report["over_budget"]} == set(listed)
    assert report["strict"] is False and report["scale"]["factor"] == 1.0
    row = next(r for r in report["over_budget"] if r["test"].endswith("test_sleeps"))
    assert row["seconds"] == pytest.approx(row["setup_s"] + row["call_s"], abs=0.11)
    assert row["outcome"] == "passed"


def test_strict_fails_each_test_over_its_budget_naming_itself(
    pytester: pytest.Pytester,
) -> None:
    result = _run(pytester, "--test-budget-s=0.2", "--budget-strict")
    result.assert_outcomes(passed=2, failed=3)
    assert {m[1] for m in STRICT.finditer(result.stdout.str())} == {
        "test_sleeps", "test_slow_in_its_fixture"}
    result.stdout.fnmatch_lines(["*AssertionError: its own failure*"])  # its failure, kept


def test_a_scale_multiplies_every_budget(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--test-budget-s=0.2", "--budget-strict", "--budget-scale=200",
                  "-k", "not own")
    result.assert_outcomes(passed=4)
    assert "over their time budget: 0 (budgets x200.00" in result.stdout.str()


def test_auto_scale_is_measured_and_never_below_one(pytester: pytest.Pytester) -> None:
    _run(pytester, "--budget-scale=auto", "-k", "quick").assert_outcomes(passed=1)
    scale = json.loads((pytester.path / ".test-budget.json").read_text())["scale"]
    assert scale["source"] == "auto" and scale["measured_s"] > 0
    expected = max(1.0, scale["measured_s"] / scale["reference_s"])
    assert scale["factor"] == pytest.approx(expected, rel=0.01)  # measured_s is rounded


def test_a_hang_fails_with_its_stack(pytester: pytest.Pytester) -> None:
    """The hard limit (pytest-timeout) fails a test that sleeps past it, and the failure
    shows where the test was stuck."""
    pytester.makepyfile(test_hangs="""
import time

def test_stuck():
    time.sleep(60)  # stuck here
""")
    result = pytester.runpytest_subprocess("-p", "tests.time_budget", "-p", "no:cacheprovider",
                                           "--timeout=1", "--test-budget-s=0.5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*time.sleep(60)  # stuck here*", "*Failed: Timeout (>1.0s)*"])


def test_bad_settings_are_refused_naming_the_fix(pytester: pytest.Pytester) -> None:
    for arg, message in (("--test-budget-s=-1", "*--test-budget-s must be > 0*got -1.0*"),
                         ("--budget-scale=fast", "*--budget-scale must be 'auto' or a number*")):
        result = _run(pytester, arg)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([message])
    pytester.makepyfile(
        test_bare="import pytest\n\n@pytest.mark.time_budget(90)\ndef test_x():\n    pass\n")
    result = pytester.runpytest("-p", "tests.time_budget", "test_bare.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # at collection, before any test ran
    result.stderr.fnmatch_lines(["*test_x: write @pytest.mark.time_budget(seconds, reason=*"])


def test_a_hard_limit_close_to_the_budget_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_close="""
import pytest

@pytest.mark.timeout(100)
@pytest.mark.time_budget(80, reason="slow")
def test_x():
    pass
""")
    result = pytester.runpytest("-p", "tests.time_budget", "test_close.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*hard limit (pytest-timeout) 100 s is under 2x its 80 s*"])
