"""The time guard (tests/time_limit.py) on a small inner suite run by pytester.

The inner tests sleep 0.3 s against a limit of 0.2 s: `time.sleep` never returns early,
so "over the limit" holds on any machine, however loaded.
"""

from __future__ import annotations

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

@pytest.mark.time_limit(30, reason="an inner test with its own limit")
def test_exempt():
    time.sleep(0.3)
"""
OVER = re.compile(
    r"^test_inner\.py::(\w+) took (\d+\.\d) s \(set-up (\d+\.\d) s \+ call (\d+\.\d) s\), "
    r"over the 0\.2 s limit \(--max-test-seconds",
    re.M,
)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest("-p", "tests.time_limit", "-p", "no:cacheprovider", *args)


def test_a_test_over_the_limit_fails_naming_itself_and_its_time(
    pytester: pytest.Pytester,
) -> None:
    result = _run(pytester, "--max-test-seconds=0.2")
    result.assert_outcomes(passed=2, failed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    over = {m[1]: [float(s) for s in m.groups()[1:]] for m in OVER.finditer(result.stdout.str())}
    assert set(over) == {"test_sleeps", "test_slow_in_its_fixture"}, result.stdout.str()
    assert over["test_sleeps"][2] >= 0.3  # the call's sleep
    assert over["test_slow_in_its_fixture"][1] >= 0.3  # set-up counts
    for took, setup, call in over.values():
        assert took == pytest.approx(setup + call, abs=0.11)
    result.stdout.fnmatch_lines(["*AssertionError: its own failure*"])  # its failure, kept


def test_every_test_under_the_limit_passes(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--max-test-seconds=60", "-k", "not own")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK


def test_zero_turns_the_guard_off(pytester: pytest.Pytester) -> None:
    _run(pytester, "--max-test-seconds=0", "-k", "not own").assert_outcomes(passed=4)


def test_bad_limits_are_refused_naming_the_fix(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--max-test-seconds=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--max-test-seconds must be >= 0*got -1.0*"])
    pytester.makepyfile(
        test_bare="import pytest\n\n@pytest.mark.time_limit(90)\ndef test_x():\n    pass\n"
    )
    result = pytester.runpytest("-p", "tests.time_limit", "test_bare.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # at collection, before any test ran
    result.stderr.fnmatch_lines(["*test_x: write @pytest.mark.time_limit(seconds, reason=*"])
