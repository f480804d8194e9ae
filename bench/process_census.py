"""A pytest plugin: which tests start child processes without the ``dist`` marker.

    python -m pytest -p bench.process_census -m "not dist and not slurm" -n 0 --census-out C.json

``bench.repeat_tests --modules dist`` repeats the modules holding a ``dist`` (or ``slurm``)
test, so a test that starts a collate process, a rank or a DataLoader worker without the
marker is never repeated. While each test runs, a thread lists this process's
descendants every few milliseconds (``psutil``) and keeps the command lines of the new
ones; a forked child shows its parent's command line. A child that ends within a few
polls (a fork that returns at once) can be missed, more so under load. Writes ``{test id: [command
line, ...]}`` for every test that started one and was not marked ``dist`` or ``slurm``
(stderr says how many). Tools a test runs (``snakemake``, ``sphinx``, ``lint-imports``,
``python -c`` import checks) are listed too: judge each line.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

import psutil
import pytest

POLL_S = 0.003  # a Python child lives far longer than this
_FOUND: dict[str, list[str]] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--census-out", type=Path, default=Path("process_census.json"))


def _descendants(me: psutil.Process) -> dict[int, str]:
    found = {}
    try:
        children = me.children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            found[child.pid] = " ".join(child.cmdline())[:200] or child.name()
        except psutil.Error:
            found[child.pid] = "(ended before it was read)"
    return found


class _Watch:
    """Collects the descendants that appear while a test runs (not those there before)."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._before = set(_descendants(self._me))
        self.seen: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="process-census", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(POLL_S):
            for pid, line in _descendants(self._me).items():
                if pid not in self._before:
                    self.seen.setdefault(pid, line)

    def stop(self) -> list[str]:
        self._done.set()
        self._thread.join()
        return sorted(set(self.seen.values()))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # refused before any test runs, not after all
        raise pytest.UsageError("bench.process_census needs -n 0 (one process sees all)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Generator[None, None, None]:
    marked = item.get_closest_marker("dist") or item.get_closest_marker("slurm")
    watch = None if marked else _Watch()
    yield
    if watch is not None and (lines := watch.stop()):
        _FOUND[item.nodeid] = lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = session.config.getoption("--census-out")
    out.write_text(json.dumps(_FOUND, indent=1, sort_keys=True) + "\n")
    modules = sorted({test_id.split("::", 1)[0] for test_id in _FOUND})
    print(
        f"\nprocess census: {len(_FOUND)} unmarked tests in {len(modules)} modules started "
        f"processes; {out}"
    )
