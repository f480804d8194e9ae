"""The suite's time guard: a test that passes but takes longer than a limit fails.

A suite that grows slower one test at a time stops being run. Every pytest run of this
repository (``tests/conftest.py`` loads this plugin; ``make test`` passes the limit
explicitly) fails a test whose **set-up and call together** take more than
``--max-test-seconds`` (default :data:`DEFAULT_LIMIT_S`; ``0`` turns the guard off).
Set-up counts, so work cannot hide from the guard in a fixture: a module fixture's cost
falls on the first test that uses it. Teardown does not count (a module fixture's
teardown runs after its last test's call, whose outcome is already reported).

The test fails with its name and time as its failure, e.g. ``tests/x.py::test_y took
72.4 s (set-up 2.1 s + call 70.3 s), over the 60 s limit (--max-test-seconds) ...``; a
test that already failed keeps its own failure. ``make test`` also lists the 15 slowest
set-up, call and teardown phases (``--durations=15``).

A test that cannot go under the limit carries its own, with the reason:
``@pytest.mark.time_limit(120, reason="...")``. Prefer making the test cheaper.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

DEFAULT_LIMIT_S = 60.0
_SETUP_S = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--max-test-seconds",
        type=float,
        default=DEFAULT_LIMIT_S,
        metavar="S",
        help=f"fail a test whose set-up + call take more than S seconds "
        f"(default {DEFAULT_LIMIT_S:g}; 0: no limit). A test's own limit: "
        "@pytest.mark.time_limit(S, reason=...)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "time_limit(seconds, reason): this test's own --max-test-seconds, with the reason "
        "it cannot be cheaper (tests/time_limit.py)",
    )
    limit = config.getoption("--max-test-seconds")
    if limit < 0:
        raise pytest.UsageError(
            f"--max-test-seconds must be >= 0 (0 turns the guard off), got {limit}"
        )


def limit_for(item: pytest.Item) -> float:
    """The limit that applies to ``item``, in seconds (0: none).

    Raises:
        pytest.UsageError: ``item`` has a ``time_limit`` mark without one number and a
            reason.
    """
    mark = item.get_closest_marker("time_limit")
    if mark is None:
        return item.config.getoption("--max-test-seconds")
    if len(mark.args) != 1 or not mark.kwargs.get("reason"):
        raise pytest.UsageError(
            f"{item.nodeid}: write @pytest.mark.time_limit(seconds, reason='why it cannot "
            f"be cheaper'), got args={mark.args} kwargs={mark.kwargs}"
        )
    return float(mark.args[0])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a malformed time_limit mark fails before any test runs
        limit_for(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call" and report.passed:
        limit = limit_for(item)
        setup = item.stash.get(_SETUP_S, 0.0)
        took = setup + report.duration
        if limit and took > limit:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {took:.1f} s (set-up {setup:.1f} s + call "
                f"{report.duration:.1f} s), over the {limit:g} s limit (--max-test-seconds; "
                "tests/time_limit.py): make the test cheaper, or give it "
                "@pytest.mark.time_limit(seconds, reason=...)"
            )
    return report
