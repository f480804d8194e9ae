"""``hand_over_gil`` waits only while this process has Gloo threads, and until they rest.

Each check runs in a fresh interpreter, so no other test's Gloo group is counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from odb._process.gil_handoff import LIMIT_S, QUIET_CHECKS, STEP_S

ROOT = Path(__file__).parents[3]

_MEASURE = """
import json, sys
from odb._process.gil_handoff import gloo_thread_states, hand_over_gil
if sys.argv[1] == "group":
    import torch, torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))
print(json.dumps([gloo_thread_states(), hand_over_gil()]))
"""


def _measure(mode: str) -> tuple[list[str], int]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, mode],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    states, sleeps = json.loads(done.stdout.splitlines()[-1])
    return states, sleeps


@pytest.mark.dist
def test_without_a_gloo_group_nothing_waits() -> None:
    assert _measure("none") == ([], 0)


@pytest.mark.dist
def test_with_a_gloo_group_it_sleeps_until_its_threads_rest_twice() -> None:
    states, sleeps = _measure("group")
    assert len(states) >= 2  # the group's worker threads and Gloo's event loop
    assert QUIET_CHECKS <= sleeps < LIMIT_S / STEP_S
