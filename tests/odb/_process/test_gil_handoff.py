"""``hand_over_gil`` waits only while this process has Gloo threads, and until they rest.

Each check runs in a fresh interpreter, so no other test's Gloo group is counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from odb._process.gil_handoff import GLOO_THREADS, QUIET_CHECKS

ROOT = Path(__file__).parents[3]
LIMIT_S = 60.0  # far above a resting group's few sleeps: reaching it means it never rested

# A Gloo thread names itself when it first runs, so one the scheduler has not run yet
# still carries the process's name (1 in 20 right after init_process_group, idle): the
# script waits until both of torch's names are there before it counts. A thread that
# never ran holds no tensor, so hand_over_gil has nothing to wait for on it. Mode
# "late" forces that ordering: the Gloo threads carry the process's name until 0.5 s
# after the all-reduce (written to their /proc comm, then written back).
_MEASURE = """
import json, sys, threading, time
from harness.threads import thread_names
from odb._process.gil_handoff import GLOO_THREADS, gloo_thread_states, hand_over_gil

def gloo_threads():
    return {task: name for task, name in thread_names().items() if name in GLOO_THREADS}

def rename(tasks):
    for task, name in tasks.items():
        with open(f"/proc/self/task/{task}/comm", "w") as comm:
            comm.write(name)

if sys.argv[1] != "none":
    import torch, torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))
    if sys.argv[1] == "late":
        gloo = gloo_threads()
        rename(dict.fromkeys(gloo, "python"))
        threading.Timer(0.5, rename, (gloo,)).start()
    named_by = time.monotonic() + 60
    while set(gloo_threads().values()) != GLOO_THREADS and time.monotonic() < named_by:
        time.sleep(0.01)
named = list(gloo_threads().values())
started = time.monotonic()
sleeps = hand_over_gil(limit_s=float(sys.argv[2]))
print(json.dumps([named, gloo_thread_states(), sleeps, time.monotonic() - started]))
"""


def _measure(mode: str) -> tuple[list[str], list[str], int, float]:
    """The Gloo threads' names and states, then ``hand_over_gil``'s sleeps and seconds."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, mode, str(LIMIT_S)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names, states, sleeps, seconds = json.loads(done.stdout.splitlines()[-1])
    return names, states, sleeps, seconds


@pytest.mark.dist
def test_without_a_gloo_group_nothing_waits() -> None:
    names, states, sleeps, _ = _measure("none")
    assert (names, states, sleeps) == ([], [], 0)


@pytest.mark.dist
def test_with_a_gloo_group_it_sleeps_until_its_threads_rest_twice() -> None:
    names, states, sleeps, seconds = _measure("group")
    assert set(names) == GLOO_THREADS  # the group's worker threads and Gloo's event loop
    assert len(states) >= len(names)  # every named one counted (more may have named since)
    assert sleeps >= QUIET_CHECKS
    assert seconds < LIMIT_S  # it stopped because they rested, not at its limit


@pytest.mark.dist
def test_gloo_threads_the_scheduler_runs_late_are_waited_for_then_counted() -> None:
    names, states, sleeps, _ = _measure("late")  # counted at once, they were not there
    assert set(names) == GLOO_THREADS and len(states) >= len(names)
    assert sleeps >= QUIET_CHECKS
