"""How `make test`'s two xdist workers share the suite (tests/workers.py), on a small inner
suite laid out like ours, run by pytester in a subprocess with `-n 2`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workers import RUN_MODULES, SLURM_MODULES, worker_group

ROOT = Path(__file__).resolve().parents[1]

# Each inner test records the worker it ran on.
RECORDING = """
import os, pathlib, pytest
pytestmark = {marks}

@pytest.mark.parametrize("i", range({n}))
def test_records_its_worker(i):
    out = pathlib.Path({out!r}) / (__name__.rsplit(".", 1)[-1] + str(i))
    out.write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))
"""


def test_slurm_modules_the_runs_and_the_core_go_beside_the_rest() -> None:
    for module in SLURM_MODULES | RUN_MODULES:
        assert worker_group(f"{module}::test_x[a::b]") == "beside"
        assert Path(ROOT, module).is_file(), module  # a renamed module would go back
    assert worker_group("tests/odb/core/test_grouping.py::TestX::test_y") == "beside"
    assert worker_group("tests/odb/test_faults.py::test_stall") == "rest"
    assert worker_group("tests/odb/test_core.py::test_x") == "rest"
    assert worker_group("tests/experiments/test_rehearsal.py.bak::x") == "rest"


def _inner_suite(pytester: pytest.Pytester, out: Path, slurm_module: str) -> None:
    """Two Slurm modules and a core module of 3 tests each, two other modules of 8."""
    files = {
        slurm_module: ("[pytest.mark.slurm]", 3),
        "tests/experiments/test_cluster.py": ("[pytest.mark.slurm]", 3),
        "tests/odb/core/test_c.py": ("[]", 3),
        "tests/odb/test_a.py": ("[]", 8),
        "tests/test_b.py": ("[]", 8),
    }
    for path, (marks, n) in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(RECORDING.format(marks=marks, n=n, out=str(out)))
    (pytester.path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: starts a cluster\n")


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str
) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return pytester.runpytest_subprocess(
        "-p", "tests.workers", "-p", "no:cacheprovider", "--import-mode=importlib", *args
    )  # fmt: skip


@pytest.mark.slow  # two xdist workers start (a few seconds)
def test_with_two_workers_the_slurm_modules_and_the_core_share_one_the_rest_the_other(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inner_suite(pytester, tmp_path, "tests/experiments/test_rehearsal.py")
    _run(pytester, monkeypatch, "-n", "2").assert_outcomes(passed=25)
    ran = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert len(ran) == 25
    beside = {
        w
        for name, w in ran.items()
        if name.startswith(("test_rehearsal", "test_cluster", "test_c"))
    }
    rest = {w for name, w in ran.items() if name.startswith(("test_a", "test_b"))}
    assert len(beside) == 1 and len(rest) == 1 and beside != rest, ran


def test_a_slurm_test_outside_the_list_is_refused_at_collection(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inner_suite(pytester, tmp_path, "tests/experiments/test_elsewhere.py")
    result = _run(pytester, monkeypatch)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*add *tests/experiments/test_elsewhere.py* to SLURM_MODULES*one cluster at a time"]
    )
    assert not list(tmp_path.iterdir())  # refused before any test ran
