"""Start-up of the collate process: an unguarded script fails fast, a stuck start times out.

Before, a script without a main guard under ``torchrun`` hung with no output (the
spawned collate process re-ran the script and blocked in its first collective while
the trainer blocked writing the start-up pickle to it). A forked collate process (the
default on Linux) re-runs nothing, so the same script trains.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

import odb
from harness.scenarios import LengthDataset
from harness.torchrun import run_torchrun
from odb._process.trainer_startup import _guarded_lines
from tests.odb.test_bad_input import _assert_no_children_left

SCRIPT = Path(__file__).parents[1] / "unguarded_script.py"
ROOT = str(Path(__file__).parents[3])


def test_guarded_lines_follow_the_main_block(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import os\nx = 1\nif __name__ == '__main__':\n    y = 2\n    z = 3\n"
        'try:\n    if "__main__" == __name__:\n        w = 4\nexcept Exception:\n    pass\n'
    )
    assert _guarded_lines(str(script)) == frozenset({4, 5, 8})


@pytest.mark.dist
def test_unguarded_script_under_torchrun_fails_fast_naming_the_guard() -> None:
    started = time.monotonic()
    code, out, err = run_torchrun(
        SCRIPT, 2, ["process", "spawn"], timeout=120, env={"PYTHONPATH": ROOT}
    )
    took = time.monotonic() - started
    assert code != 0, out[-2000:]
    assert 'if __name__ == "__main__":' in err and "collate_mode='thread'" in err, err[-3000:]
    assert "unguarded_script.py:1" in err, err[-3000:]  # the line that builds the loader
    assert took < 60, f"took {took:.0f} s to fail"


@pytest.mark.dist
@pytest.mark.parametrize("how", [["thread"], ["process", "fork"]], ids=["thread", "forked-process"])
def test_unguarded_script_trains_without_a_spawned_process(how: list[str]) -> None:
    code, out, err = run_torchrun(SCRIPT, 2, how, timeout=120, env={"PYTHONPATH": ROOT})
    assert code == 0, err[-3000:]
    # Two ranks share one stdout pipe, so their lines may interleave: match, do not split.
    counts = sorted(re.findall(r"RESULT (\d+) (\d+)", out))
    assert [r for r, _ in counts] == ["0", "1"], out[-2000:]
    assert sum(int(n) for _, n in counts) == 40, out[-2000:]


class SlowToUnpickle(LengthDataset):
    """A dataset whose unpickling (in the collate process) takes far too long."""

    def __setstate__(self, state: dict) -> None:
        time.sleep(120)
        self.__dict__.update(state)


@pytest.mark.dist
def test_a_collate_process_that_does_not_start_is_an_error_within_the_deadline() -> None:
    loader = odb.ODBLoader(
        SlowToUnpickle([5, 6, 7]),
        token_budget=64,
        start_timeout_s=3.0,
        collate_start_method="spawn",  # a forked process unpickles nothing
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not start within start_timeout_s=3.0 s"):
        next(iter(loader))
    assert time.monotonic() - started < 15
    _assert_no_children_left(before)
