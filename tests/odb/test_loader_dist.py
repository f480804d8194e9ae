"""The protocol's guarantees on real ranks over Gloo, with randomized seeded scenarios.

Thread-mode scenarios at W = 1-4 and process-mode ones at W = 2, 3, drawn by
``draw_scenario`` (up to 160 samples, up to 3 epochs); ``test_soak.py``'s slice draws the
soak's wider space (set-ups, workers, sharing strategies) with shorter scenarios. A
module fixture runs every scenario of one world size in one spawn of its ranks (4
spawns, were 6).
"""

from __future__ import annotations

import os

import pytest

from harness.scenarios import check_scenario, draw_scenario, run_scenario
from tests.odb.rank_calls import LazyCalls

pytestmark = pytest.mark.dist

BASE_SEED = int(os.environ.get("ODB_TEST_SEED", "1234"))
THREAD_WORLDS, PROCESS_WORLDS = (1, 2, 3, 4), (2, 3)


def _seeds(world_size: int, mode: str) -> list[int]:
    if mode == "thread":
        return [BASE_SEED + 100 * world_size + k for k in range(10)]
    return [BASE_SEED + 7000 + 10 * world_size + k for k in range(2)]


def _run_many(rank: int, world_size: int, seeds: list[int], mode: str) -> list:
    return [run_scenario(draw_scenario(seed, world_size, mode)) for seed in seeds]


@pytest.fixture(scope="module")
def results() -> LazyCalls:
    """Per (world size, mode), each rank's records of every scenario; one spawn per world
    size runs its thread and process scenarios, when its first test asks."""
    calls = {(w, "thread"): (w, _run_many, (_seeds(w, "thread"), "thread"))
             for w in THREAD_WORLDS}
    calls |= {(w, "process"): (w, _run_many, (_seeds(w, "process"), "process"))
              for w in PROCESS_WORLDS}
    return LazyCalls(calls, timeout=240)


def _check_all(results: LazyCalls, world_size: int, mode: str) -> None:
    per_rank = results[(world_size, mode)]
    for k, seed in enumerate(_seeds(world_size, mode)):
        scenario = draw_scenario(seed, world_size, mode)
        try:
            check_scenario(scenario, [per_rank[r][k] for r in range(world_size)])
        except AssertionError as exc:
            raise AssertionError(
                f"scenario seed={seed} W={world_size} {scenario.options}: {exc}"
            ) from exc


@pytest.mark.parametrize("world_size", THREAD_WORLDS)
def test_random_scenarios_thread_mode(results: LazyCalls, world_size: int) -> None:
    _check_all(results, world_size, "thread")


@pytest.mark.parametrize("world_size", PROCESS_WORLDS)
def test_random_scenarios_process_mode(results: LazyCalls, world_size: int) -> None:
    _check_all(results, world_size, "process")
