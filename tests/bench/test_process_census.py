"""``bench.process_census`` names the unmarked tests that start a process, and only those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

TESTS = """
import multiprocessing, os, subprocess, sys, pytest

def _child():
    import time
    time.sleep(0.5)  # lives far longer than the census's polling interval

def test_forks_a_child():
    process = multiprocessing.get_context("fork").Process(target=_child)
    process.start()
    process.join()

def test_runs_a_command():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)

@pytest.mark.dist
def test_marked_and_spawning():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_starts_nothing():
    assert sum(range(10)) == 45
"""


@pytest.mark.dist
def test_only_the_unmarked_tests_that_start_processes_are_listed(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    dist: spawns\n")
    out = tmp_path / "census.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "bench.process_census",
        "-p",
        "no:cacheprovider",
        "--census-out",
        str(out),
        "test_sample.py",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text())
    assert sorted(found) == [
        "test_sample.py::test_forks_a_child",
        "test_sample.py::test_runs_a_command",
    ]
    assert any("time.sleep(0.5)" in line for line in found["test_sample.py::test_runs_a_command"])
