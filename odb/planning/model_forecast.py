"""Epoch times of ODB, the fixed-batch Standard and the oracle under a
:class:`odb.planning.step_cost.StepModel` (the architecture-based cost).

The same steps as :mod:`odb.planning.forecast` (the loader's own round protocol for ODB,
the loader's views for Standard, global sort for the oracle), each step timed from the
lengths and vision patches of its samples instead of its token count. A sample's
measured patches (``patches_fn``: vision patches before the merge) count as one image's
(its vision attention is then an upper bound when a sample holds several images); with
none measured, the vision tower costs nothing beyond the image tokens' text cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from odb.core.budget import TokenBudget
from odb.core.config import ODBConfig
from odb.core.grouping import SizedSample, form_groups
from odb.planning.simulate import SimResult, round_robin_views
from odb.planning.step_cost import (
    Constants,
    Sample,
    Schedule,
    Setup,
    StepModel,
    fit_constants,
    schedule_terms,
)


def _samples(lengths: Sequence[int], patches: Sequence[int] | None) -> list[Sample]:
    if patches is None:
        return [(int(n), ()) for n in lengths]
    return [(int(n), (int(p),) if p else ()) for n, p in zip(lengths, patches, strict=True)]


def odb_schedule(sim: SimResult, samples: Sequence[Sample]) -> Schedule:
    """Every rank's ODB steps (IDLE = an empty step) from the simulated traces."""
    out = []
    for rank in sim.ranks:
        groups = iter(rank.ids)
        out.append([[samples[i] for i in next(groups)] if cost else [] for cost in rank.costs])
    return out


def standard_schedule(
    samples: Sequence[Sample], budget: int, cutoff: int, world_size: int, config: ODBConfig
) -> Schedule:
    """The fixed-batch Standard's steps over the loader's views."""
    size = max(1, budget // cutoff)
    views = round_robin_views(len(samples), world_size, config.seed, 0, config.shuffle)
    return [[[samples[i] for i in view[k : k + size]] for k in range(0, len(view), size)]
            for view in views]  # fmt: skip


def oracle_schedule(samples: Sequence[Sample], budget: TokenBudget, world_size: int) -> Schedule:
    """Globally sorted groups under the budget, dealt round-robin."""
    items = [SizedSample(i, n) for i, (n, _) in enumerate(samples)]
    groups = [[samples[int(it.key)] for it in g.items] for g in form_groups(items, budget)]
    return [groups[rank::world_size] for rank in range(world_size)]


def model_epochs(
    model: StepModel,
    sim: SimResult,
    lengths: Sequence[int],
    patches: Sequence[int] | None,
    cutoff: int,
) -> tuple[float, float, float]:
    """``(ODB, Standard, oracle)`` epoch seconds of one budget and world size."""
    config = sim.config
    world = sim.world_size
    model = StepModel(model.setup.with_world(world), model.constants)
    samples = _samples(lengths, patches)
    return (
        model.epoch_seconds(odb_schedule(sim, samples)),
        model.epoch_seconds(standard_schedule(samples, config.token_budget, cutoff, world,
                                              config)),
        model.epoch_seconds(oracle_schedule(samples, config.budget, world)),
    )  # fmt: skip


def probe_constants(
    tries: Sequence[dict[str, Any]], longest: int, shortest: int, setup: Setup
) -> Constants | None:
    """The two constants from the memory probe's timed worst batches (one GPU; each
    try times ``longest``-token copies, then ``shortest``-token copies, as
    :func:`odb.planning.probe.worst_batches` builds them); None when they do not fit."""
    single = setup.with_world(1)
    observations = []
    for t in tries:
        if not t["fits"]:
            continue
        for (seconds, tokens), length in zip(t["timings"], (longest, shortest), strict=False):
            step: list[Sample] = [(length, ())] * max(1, int(tokens) // length)
            observations.append((schedule_terms(single, [[step]]), float(seconds)))
    try:
        return fit_constants(observations)
    except ValueError:
        return None
