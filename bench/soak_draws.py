"""The soak's scenarios drawn from their seeds, and how the drawn ones cover the space.

Each seed draws a world size, collate thread or process (forked, spawned or started by a
forkserver), the trainer's sharing strategy, DataLoader workers and their start,
budgets, lengths, ODB's options, who shards and rank 0's lone save; some scenarios stop
early (:mod:`bench.early_stop`). Later draws come from streams of their own, so adding
one never changes what an earlier seed drew. ``quick`` (the CI slice) draws the same
space, cheaper.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.early_stop import EarlyStop, draw_stop, early_stop_scenario
from harness.scenarios import SETUPS, Scenario, draw_lengths

BUDGETS = (4, 16, 64, 256, 1024, 8192)
STARTS = ("fork", "fork", "spawn", "forkserver")  # of a collate process; fork is Linux's default


@dataclass(frozen=True)
class Draw:
    """One seed's scenario and what its ranks set before they build the loader."""

    scenario: Scenario
    worker_start: str  # the ranks' global start method (their DataLoader workers')
    sharing: str  # torch.multiprocessing's sharing strategy
    stop: EarlyStop | None = None  # the early-stop draw (bench/early_stop.py)


def draw(seed: int, quick: bool = False) -> Draw:
    """The scenario of ``seed``, its ranks' start method and sharing strategy, and
    whether it stops early (:mod:`bench.early_stop`).

    ``quick`` (the CI slice) draws the same space but cheaper: one or two epochs, at
    most 60 samples, a collate process in a third of the scenarios (each costs a
    process start per epoch) and forked workers only.
    """
    return _with_stop(_draw_quick(seed) if quick else _draw_full(seed), quick)


def _draw_quick(seed: int) -> Draw:
    scenario = _draw_full(seed).scenario
    rng = random.Random(seed * 7919 + 1)
    mode = "process" if rng.random() < 1 / 3 else "thread"
    options = dict(scenario.options, collate_mode=mode)
    options.pop("collate_start_method", None)
    lengths = scenario.lengths[:60]
    epochs = min(scenario.epochs, 2)
    quick_scenario = Scenario(seed, scenario.world_size, lengths, options, epochs=epochs)
    quick_scenario, sharing = _with_processes(quick_scenario, rotate=True)
    return Draw(_with_setup(quick_scenario, rotate=True), "fork", sharing)


def _draw_full(seed: int) -> Draw:
    rng = random.Random(seed)
    world_size = rng.randint(1, 4)
    mode = rng.choice(["thread", "process"])
    budget = rng.choice(BUDGETS)
    n = rng.choice([0, 1, world_size - 1, rng.randint(world_size, 40), rng.randint(40, 160)])
    skewed = rng.random() < 0.5
    lengths = draw_lengths(rng, max(n, 0), budget, world_size, skewed)
    # A few samples over the budget whatever the profile (singleton groups).
    lengths = [
        rng.randint(budget + 1, 2 * budget + 1) if rng.random() < 0.05 else length
        for length in lengths
    ]
    workers = rng.choice([0, 1, 2])
    options = dict(
        token_budget=budget,
        policy=rng.choice(["balanced", "paper"]),
        join=rng.random() < 0.6,
        grad_accum_steps=rng.choice([1, 1, 2, 3]),
        buffer_budgets=rng.choice([1, 2, 8, 64]),
        buffer_size=rng.choice([1, 4, 16, 256]),
        queue_depth=rng.choice([1, 2, 8]),
        age_limit=rng.choice([1, 4, 16]),
        shuffle=not skewed,
        seed=rng.randint(0, 1000),
        collate_mode=mode,
        num_workers=workers,
        prefetch_factor=rng.choice([1, 2, 4]) if workers else None,
        align_timeout_s=60.0,
        init_timeout_s=60.0,
    )
    start_method = "spawn" if rng.random() < 0.2 else "fork"
    scenario = Scenario(seed, world_size, lengths, options, epochs=rng.choice([1, 2, 3]))
    scenario, sharing = _with_processes(scenario)
    return Draw(_with_setup(scenario), start_method, sharing)


def _with_stop(drawn: Draw, quick: bool) -> Draw:
    """Draw whether the scenario stops early (:func:`bench.early_stop.draw_stop`); if so
    it becomes an early-stop scenario, run on fresh ranks of its own."""
    stop = draw_stop(drawn.scenario.seed, quick)
    if stop is None:
        return drawn
    scenario = early_stop_scenario(drawn.scenario)
    if quick:  # two launches of fresh ranks each: the CI slice keeps them small
        scenario = dataclasses.replace(
            scenario, world_size=min(scenario.world_size, 2), work=min(scenario.work, 4)
        )
    return dataclasses.replace(drawn, scenario=scenario, stop=stop)


def _with_processes(scenario: Scenario, rotate: bool = False) -> tuple[Scenario, str]:
    """Draw the collate process's start and the trainer's sharing strategy (issue 31).

    From a stream of their own, so every earlier draw of a seed stays as it was. Half
    the collate processes fork (Linux's default), the others spawn or use a forkserver;
    a third of the scenarios share tensors through ``file_system`` (torch_shm_manager),
    as many training scripts set. ``rotate`` (the quick draw) takes them in turn by
    seed instead: half the scenarios ``file_system``, the starts in turn.
    """
    rng = random.Random(scenario.seed * 7919 + 3)
    sharing = "file_system" if rng.random() < 1 / 3 else "file_descriptor"
    start = rng.choice(STARTS)
    if rotate:
        sharing = ("file_descriptor", "file_system")[scenario.seed % 2]
        start = STARTS[scenario.seed // 2 % len(STARTS)]
    if scenario.options["collate_mode"] != "process":
        return scenario, sharing
    options = dict(scenario.options, collate_start_method=start)
    return dataclasses.replace(scenario, options=options), sharing


def _with_setup(scenario: Scenario, rotate: bool = False) -> Scenario:
    """Draw who shards (``SETUPS``) and rank 0's lone save, from a stream of their own.

    A separate generator keeps every earlier draw of a seed as it was. Per-rank data and
    streams are drawn for join scenarios only (non-join is for one global dataset, and a
    non-join stream's carry is not bounded across epochs) and need a sample on every
    rank (an IDLE step is built from one of the rank's own samples). ``rotate`` (the
    quick draw) takes the set-ups in turn by seed, so a short slice covers them all.
    """
    rng = random.Random(scenario.seed * 7919 + 2)
    setup = rng.choice(SETUPS if scenario.options["join"] else SETUPS[:2])
    if rotate and scenario.options["join"]:  # the CI slice: every set-up in a short run
        setup = SETUPS[scenario.seed % len(SETUPS)]
    if setup not in SETUPS[:2] and len(scenario.lengths) < scenario.world_size:
        setup = "global"
    save_step = rng.choice([0, 1, 3])
    return Scenario(
        scenario.seed,
        scenario.world_size,
        scenario.lengths,
        scenario.options,
        scenario.epochs,
        setup=setup,
        save_step=save_step,
    )


def coverage(draws: list[Draw]) -> dict[str, Any]:
    """How the drawn scenarios cover the space: counts by collate mode and start, sharing
    strategy, workers, termination and set-up, and the number of rank-0-only saves."""
    drawn = [d.scenario for d in draws]
    starts = Counter(
        d.options["collate_start_method"] for d in drawn if d.options["collate_mode"] == "process"
    )
    return dict(
        by_collate_mode=dict(Counter(d.options["collate_mode"] for d in drawn)),
        by_collate_start=dict(sorted(starts.items())),
        by_sharing_strategy=dict(sorted(Counter(d.sharing for d in draws).items())),
        by_num_workers=dict(sorted(Counter(d.options["num_workers"] for d in drawn).items())),
        by_termination=dict(Counter("join" if d.options["join"] else "non-join" for d in drawn)),
        by_setup=dict(sorted(Counter(d.setup for d in drawn).items())),
        rank0_only_saves=sum(1 for d in drawn if d.save_step),
        by_early_stop=dict(sorted(Counter(d.stop.kind for d in draws if d.stop).items())),
    )
