"""Suite-wide settings: no hub access, a fixed Hypothesis profile, the time budgets
(tests/time_budget.py), `gpu` tests skipped without CUDA, and one pool of warm rank
processes for `run_ranks` (`fresh_ranks`: none)."""

import os
from collections.abc import Iterator
from typing import Any

# Nothing on the CPU-scale path may fetch from a hub. Set at import, before any test
# module (or a rank process it spawns, which inherits the environment) imports HF code.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One intra-op thread per process (unless set): two xdist workers and their rank
# processes already fill the 2 cores, and torch's spin-waiting OpenMP threads collapse
# beside busy processes (a matmul loop took 15 s instead of 0.5 s next to two of them;
# tests/time_budget.py). torchrun sets the same for the ranks it starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from harness.ranks import RankPool, use_pool

# The time budgets (over-budget tests reported, hangs fail), the xdist workers' shares
# (tests/workers.py) and pytester for the budgets' own tests.
pytest_plugins = ["pytester", "tests.time_budget", "tests.workers"]

# A clean clone has no `.hypothesis/` example database, so a randomized run would never
# replay a failure another run found. The default `ci` profile derandomizes: every run
# draws the same examples, so a failure found once fails every time until fixed, and
# no deadline (a loaded 2-core machine is not a property's failure).
# HYPOTHESIS_PROFILE=explore draws new examples (and keeps a local database).
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# One pool of warm rank processes for the session (harness/ranks.py, docs/testing.md): every
# run_ranks call of a test takes its ranks from it, unless the test is marked fresh_ranks.
# Set per test for its whole run, so the module fixtures it sets up follow its marker.
_RANK_POOL = RankPool()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    fresh = item.get_closest_marker("fresh_ranks") is not None
    with use_pool(None if fresh else _RANK_POOL):
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _RANK_POOL.close()
    worker_output = getattr(session.config, "workeroutput", None)  # on an xdist worker
    if worker_output is not None and _RANK_POOL.counts:
        worker_output["rank_pool"] = _RANK_POOL.summary()


_WORKER_POOL_SUMMARIES: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: a worker's rank-pool summary, for the end of the report."""
    summary = getattr(node, "workeroutput", {}).get("rank_pool")
    if summary:
        _WORKER_POOL_SUMMARIES.append(f"[{node.gateway.id}] {summary}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _RANK_POOL.counts:
        terminalreporter.write_line(_RANK_POOL.summary())
    for line in _WORKER_POOL_SUMMARIES:
        terminalreporter.write_line(line)
