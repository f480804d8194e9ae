"""The protocol's guarantees on real ranks over Gloo, with randomized seeded scenarios."""

from __future__ import annotations

import os

import pytest

from tests.dist import run_ranks
from tests.odb.scenarios import check_scenario, draw_scenario, run_scenario

pytestmark = pytest.mark.dist

BASE_SEED = int(os.environ.get("ODB_TEST_SEED", "1234"))


def _run_many(rank: int, world_size: int, seeds: list[int], mode: str) -> list:
    return [run_scenario(draw_scenario(seed, world_size, mode)) for seed in seeds]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_random_scenarios_thread_mode(world_size: int) -> None:
    seeds = [BASE_SEED + 100 * world_size + k for k in range(10)]
    results = run_ranks(_run_many, world_size, seeds, "thread", timeout=240)
    for k, seed in enumerate(seeds):
        scenario = draw_scenario(seed, world_size, "thread")
        try:
            check_scenario(scenario, [results[r][k] for r in range(world_size)])
        except AssertionError as exc:
            raise AssertionError(
                f"scenario seed={seed} W={world_size} {scenario.options}: {exc}"
            ) from exc


@pytest.mark.parametrize("world_size", [2, 3])
def test_random_scenarios_process_mode(world_size: int) -> None:
    seeds = [BASE_SEED + 7000 + 10 * world_size + k for k in range(2)]
    results = run_ranks(_run_many, world_size, seeds, "process", timeout=240)
    for k, seed in enumerate(seeds):
        scenario = draw_scenario(seed, world_size, "process")
        check_scenario(scenario, [results[r][k] for r in range(world_size)])
