"""The suite's time budgets: every test's set-up + call is compared with a budget, and the
ones over it are reported; a test fails on time only when it hangs.

A suite that grows slower one test at a time stops being run, so every test has a budget
(``--test-budget-s``, default :data:`DEFAULT_BUDGET_S`; a test that cannot be cheaper
carries ``@pytest.mark.time_budget(seconds, reason="...")``). Set-up counts, so work
cannot hide in a fixture: a module fixture's cost falls on the first test that uses it.

Budgets are read, not enforced: the machines that run the suite are shared and their
speed moves by 2x from hour to hour, so a wall-clock verdict would fail correct tests on
a slow hour. By default a test over its budget **passes**; the end of the run lists every
such test with its set-up and call seconds, and a JSON report (``--budget-report``,
default :data:`DEFAULT_REPORT`) holds the list, the budgets and the scale applied.

Two things do fail a run on time:

- **a hang**: ``pytest-timeout`` stops a test past its hard limit (the ini's ``timeout``,
  or the test's ``@pytest.mark.timeout``) and fails it with its stack. A hard limit must
  be at least :data:`HARD_LIMIT_FACTOR` times the test's budget (checked at collection),
  so no slow-but-correct test meets it;
- ``--budget-strict`` (``make test-budget``), asked for on purpose: a test over its budget
  fails, naming itself and its seconds. ``--budget-scale auto`` first times a short
  reference workload and multiplies every budget by how much slower than
  :data:`REFERENCE_S` it ran (never below 1), so a busy machine does not read as slow tests.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Generator

import pytest

DEFAULT_BUDGET_S = 60.0
DEFAULT_REPORT = ".test-budget.json"
HARD_LIMIT_FACTOR = 2.0
# reference_workload()'s median on the developer's idle 2-core machine (3 runs, 2026-12-03)
REFERENCE_S = 0.23
_SETUP_S = pytest.StashKey[float]()
_SCALE = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("time budgets (tests/time_budget.py)")
    group.addoption("--test-budget-s", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                    help=f"a test's budget for set-up + call (default {DEFAULT_BUDGET_S:g}); "
                    "a test over it is reported (failed with --budget-strict). A test's own: "
                    "@pytest.mark.time_budget(S, reason=...)")
    group.addoption("--budget-strict", action="store_true",
                    help="fail every test over its budget (make test-budget)")
    group.addoption("--budget-scale", default="1", metavar="F|auto",
                    help="multiply every budget by F; 'auto' times a reference workload "
                    f"against its idle {REFERENCE_S:g} s (default 1)")
    group.addoption("--budget-report", default=DEFAULT_REPORT, metavar="PATH",
                    help=f"where the JSON list of over-budget tests goes (default "
                    f"{DEFAULT_REPORT}, under the rootdir); '' writes none")


def reference_workload() -> float:
    """Seconds for a fixed CPU workload like the suite's (Python loops, small tensor ops)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # intra-op threads that spin-wait on a busy machine measure
    try:                      # their own contention (seen: 15 s instead of 0.5 s)
        start = time.perf_counter()
        a = torch.ones(96, 96)
        for _ in range(1000):
            a = (a @ a).clamp_(max=1.0)
        sum(i * i for i in range(2_000_000))
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def _scale(config: pytest.Config) -> dict:
    raw = config.getoption("--budget-scale")
    if raw != "auto":
        try:
            factor = float(raw)
        except ValueError:
            factor = 0.0
        if factor <= 0:
            raise pytest.UsageError(f"--budget-scale must be 'auto' or a number > 0, got {raw!r}")
        return {"factor": factor, "source": "--budget-scale"}
    measured = statistics.median(reference_workload() for _ in range(3))
    return {"factor": max(1.0, measured / REFERENCE_S), "source": "auto",
            "reference_s": REFERENCE_S, "measured_s": round(measured, 3)}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "time_budget(seconds, reason): this test's own --test-budget-s, with the "
        "reason it cannot be cheaper (tests/time_budget.py)")
    if config.getoption("--test-budget-s") <= 0:
        raise pytest.UsageError(
            f"--test-budget-s must be > 0, got {config.getoption('--test-budget-s')}")
    workerinput = getattr(config, "workerinput", None)  # an xdist worker: the controller's
    if workerinput is not None:
        config.stash[_SCALE] = workerinput["budget_scale"]
    else:
        config.stash[_SCALE] = _scale(config)
        config.pluginmanager.register(OverBudget(config), "time_budget_report")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # xdist: every worker uses the controller's scale
    node.workerinput["budget_scale"] = node.config.stash[_SCALE]


def budget_for(item: pytest.Item) -> float:
    """The budget that applies to ``item``, in seconds, before the scale.

    Raises:
        pytest.UsageError: ``item`` has a ``time_budget`` mark without one number and a
            reason.
    """
    mark = item.get_closest_marker("time_budget")
    if mark is None:
        return item.config.getoption("--test-budget-s")
    if len(mark.args) != 1 or not mark.kwargs.get("reason"):
        raise pytest.UsageError(
            f"{item.nodeid}: write @pytest.mark.time_budget(seconds, reason='why it cannot "
            f"be cheaper'), got args={mark.args} kwargs={mark.kwargs}")
    return float(mark.args[0])


def hard_limit_for(item: pytest.Item) -> float:
    """``item``'s pytest-timeout limit in seconds (0: none): its mark, else ``--timeout``,
    else the ini's ``timeout``."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        return float(mark.args[0] if mark.args else mark.kwargs.get("timeout") or 0)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout not loaded
        return 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # malformed marks and too-close hard limits fail before any test runs
        budget, hard = budget_for(item), hard_limit_for(item)
        if hard and hard < HARD_LIMIT_FACTOR * budget:
            raise pytest.UsageError(
                f"{item.nodeid}: its hard limit (pytest-timeout) {hard:g} s is under "
                f"{HARD_LIMIT_FACTOR:g}x its {budget:g} s budget; a slow machine would fail "
                f"it. Raise @pytest.mark.timeout to >= {HARD_LIMIT_FACTOR * budget:g}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call":
        budget = budget_for(item) * item.config.stash[_SCALE]["factor"]
        setup = item.stash.get(_SETUP_S, 0.0)
        report.user_properties.append(("time_budget", {"budget_s": budget, "setup_s": setup}))
        took = setup + report.duration
        if item.config.getoption("--budget-strict") and report.passed and took > budget:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {took:.1f} s (set-up {setup:.1f} s + call "
                f"{report.duration:.1f} s), over its {budget:g} s budget (--budget-strict; "
                "tests/time_budget.py): make the test cheaper, or give it "
                "@pytest.mark.time_budget(seconds, reason=...)")
    return report


class OverBudget:
    """The controller's list of calls over their budget (a run without xdist: this
    process's), printed at the end and written to ``--budget-report``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        budget = dict(report.user_properties).get("time_budget")
        if report.when != "call" or budget is None:
            return
        took = budget["setup_s"] + report.duration
        if took > budget["budget_s"]:
            self.rows.append({
                "test": report.nodeid, "seconds": round(took, 1),
                "setup_s": round(budget["setup_s"], 1), "call_s": round(report.duration, 1),
                "budget_s": round(budget["budget_s"], 1), "outcome": report.outcome})

    def pytest_terminal_summary(self, terminalreporter) -> None:
        config, tr = self.config, terminalreporter
        if config.option.collectonly:
            return
        rows = sorted(self.rows, key=lambda r: -r["seconds"])
        scale = config.stash[_SCALE]
        tr.section(f"over their time budget: {len(rows)} (budgets x{scale['factor']:.2f}, "
                   f"{scale['source']})", sep="-")
        for row in rows:
            tr.write_line(f"{row['seconds']:7.1f} s  (set-up {row['setup_s']:.1f} + call "
                          f"{row['call_s']:.1f}; budget {row['budget_s']:g} s)  {row['test']}")
        if config.getoption("--budget-report"):
            out = config.rootpath / config.getoption("--budget-report")
            out.write_text(json.dumps({
                "scale": scale, "strict": config.getoption("--budget-strict"),
                "default_budget_s": config.getoption("--test-budget-s"),
                "over_budget": rows}, indent=1) + "\n")
            tr.write_line(f"time budgets: {out}")
