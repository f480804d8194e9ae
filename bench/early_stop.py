"""The soak's early-stop draw: a run that stops at a drawn step, resumes, and ends normally.

A training script often leaves its loop before the epoch ends: ``max_steps`` reached
(``break``), the iterator still held by a trainer object until the interpreter ends, or
an exception the script handles (a NaN check, a time limit). Each must end with exit
code 0 on every rank, lose no sample and hang nowhere (issue 43: thread mode once
aborted such runs at exit). A drawn scenario runs in two launches of fresh ranks, as
a job that reached ``max_steps`` and the job that resumes it:

1. every rank iterates epoch 0 up to the drawn step, takes its state piece there (the
   checkpoint), stops in the drawn way (:data:`STOPS`), returns, and its process ends;
2. new ranks resume from every rank's piece and run the rest of the epoch.

``harness.ranks.run_ranks`` fails a launch whose ranks exit with another code than 0.

:func:`audit` counts what the two loaders yielded together against the epoch: each
sample exactly once. Early-stop scenarios are join runs over one map-style dataset
(dealt by ODB or by a user's sampler), where that is the guarantee.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

import odb
from harness.scenarios import Scenario, build_loader, draw_lengths

STOPS = ("break", "held", "exception")
SHARE = 0.25  # of the full draw's scenarios
_HELD: list[Any] = []  # iterators a "held" stop keeps referenced until the interpreter ends


@dataclass(frozen=True)
class EarlyStop:
    """How and where the loop stops: after yielding its step ``step`` (0-based)."""

    kind: str
    step: int


class _StopTraining(Exception):
    """What a script's loop raises to stop (the script catches it)."""


def draw_stop(seed: int, quick: bool = False) -> EarlyStop | None:
    """Whether ``seed``'s scenario stops early, and how; from a stream of its own.

    The full draw stops a quarter of the scenarios; the quick one (the CI slice) every
    tenth seed, taking the kinds in turn.
    """
    if quick:
        if seed % 10:
            return None
        return EarlyStop(STOPS[seed // 10 % len(STOPS)], seed // 30 % 3)
    rng = random.Random(seed * 7919 + 4)
    if rng.random() >= SHARE:
        return None
    return EarlyStop(rng.choice(STOPS), rng.choice([0, 1, 2, 4]))


def early_stop_scenario(scenario: Scenario) -> Scenario:
    """``scenario`` made an early-stop one: one epoch, join, one map-style dataset,
    enough samples (40-160 under a budget of 16-256 tokens) for several steps, and in
    two thirds of them samples that cost real torch work (a stop then finds the collate
    side inside it, where thread mode once aborted at exit; 40 samples of ~0.1 s)."""
    rng = random.Random(scenario.seed * 7919 + 5)
    budget = rng.choice([16, 64, 256])
    lengths = draw_lengths(rng, rng.randint(40, 160), budget, scenario.world_size, False)
    options = dict(scenario.options, token_budget=budget, join=True, shuffle=True)
    setup = rng.choice(["global", "sampler"])
    work = rng.choice([0, 4, 32])  # none, ~10 ms, ~0.1 s a sample
    if work == 32:  # read by the collate side itself, as in the reproducer
        lengths = lengths[:40]  # the resumed rest of the epoch stays a few seconds
        options.update(num_workers=0, prefetch_factor=None)
    return dataclasses.replace(
        scenario, lengths=lengths, options=options, epochs=1, setup=setup, save_step=0, work=work
    )


def stop_early(scenario: Scenario, stop: EarlyStop) -> dict[str, Any]:
    """Rank body of the first launch: epoch 0 up to the stop; each step's ids, this
    rank's state piece at the stop, and whether the loop stopped before the epoch ended.
    The process then ends with the stopped loader as the stop left it."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    loader, _ = build_loader(scenario, rank, world)
    before, piece, stopped = _stop_early(loader, stop)
    return dict(before=before, piece=piece, stopped=stopped)


def resume(scenario: Scenario, pieces: list[dict[str, Any]]) -> list[list[int]]:
    """Rank body of the second launch: each step's ids of the rest of the epoch, from
    every rank's piece."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    loader, _ = build_loader(scenario, rank, world)
    loader.load_state_dict(pieces)
    return [list(odb.pop_step_info(batch).sample_ids) for batch in loader]


def _stop_early(
    loader: odb.ODBLoader, stop: EarlyStop
) -> tuple[list[list[int]], dict[str, Any], bool]:
    """Each step's ids up to the stop, this rank's piece there, and whether it stopped."""
    steps: list[list[int]] = []
    iterator = iter(loader)
    try:
        piece = _consume(iterator, loader, stop, steps)
    except _StopTraining as exc:
        piece = exc.args[0]
    if stop.kind == "held":
        _HELD.append(iterator)
    stopped = piece is not None
    return steps, piece if stopped else loader.state_dict(), stopped


def _consume(
    iterator: Any, loader: odb.ODBLoader, stop: EarlyStop, steps: list[list[int]]
) -> dict[str, Any] | None:
    for step, batch in enumerate(iterator):
        steps.append(list(odb.pop_step_info(batch).sample_ids))
        if step == stop.step:
            piece = loader.state_dict()
            if stop.kind == "exception":
                raise _StopTraining(piece)
            return piece
    return None


def audit(
    scenario: Scenario, stopped: list[dict[str, Any]], resumed: list[list[list[int]]]
) -> dict[str, Any]:
    """``lost_ids``, ``duplicated_ids`` and ``step_count_disagreements`` over both
    launches (``stopped``: the first's rank results; ``resumed``: the second's, empty
    when the epoch ended before the stop), and ``invariant`` for an id outside the
    dataset."""
    parts = [[r["before"] for r in stopped], resumed]
    seen = Counter(i for part in parts for rank_steps in part for step in rank_steps for i in step)
    counts = {
        "lost_ids": len(set(range(len(scenario.lengths))) - set(seen)),
        "duplicated_ids": sum(n - 1 for n in seen.values() if n > 1),
        "step_count_disagreements": 0,
    }
    for part in parts:
        counts["step_count_disagreements"] += len({len(rank_steps) for rank_steps in part}) > 1
    result: dict[str, Any] = counts
    foreign = sorted(i for i in seen if not 0 <= i < len(scenario.lengths))
    if foreign:
        result["invariant"] = f"ids outside the dataset: {foreign[:10]}"
    return result
