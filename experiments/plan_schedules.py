"""Every method's epoch as the step-cost model reads it, over a proxy's own samples.

A proxy (``experiments.data.proxies``) gives each sample's post-pipeline length and its
images' vision patches (image tokens x the 2x2 merge); a method's plan (the baselines'
own pure plans, ODB's own round protocol through :func:`odb.planning.simulate.simulate`)
gives which samples every rank takes at every step. :func:`schedule` joins the two into
the :data:`odb.planning.step_cost.Schedule` the cost model times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import odb
from baselines.methods import BMTPlan, GMTPlan, PackingPlan, SortedPlan, StandardPlan
from baselines.plans import permutation
from experiments.data.proxy_lengths import MERGE_SIZE, image_tokens
from experiments.data.proxy_plans import ProxyConfig, calibrate
from odb.planning.simulate import simulate
from odb.planning.step_cost import Schedule

METHODS = ("standard", "sorted", "gmt", "bmt", "packing", "odb")
PACKED = {"packing"}


@dataclass(frozen=True)
class Samples:
    """Per-sample lengths and vision patches of each image."""

    name: str
    lengths: tuple[int, ...]
    images: tuple[tuple[int, ...], ...]


@lru_cache(maxsize=16)
def proxy_samples(name: str, num_samples: int = 2000, seed: int = 0) -> Samples:
    """The proxy's samples: its calibrated model lengths and its images' patches."""
    cfg = ProxyConfig(name, num_samples=num_samples, seed=seed)
    _, plans, lengths = calibrate(cfg)
    images = tuple(
        tuple(image_tokens(h, w, cfg.image_max_pixels) * MERGE_SIZE**2 for h, w in plan.images)
        for plan in plans
    )
    return Samples(name, tuple(int(n) for n in lengths), images)


def text_samples(name: str, lengths: Sequence[int]) -> Samples:
    """Samples without images (a text model's run)."""
    return Samples(name, tuple(int(n) for n in lengths), tuple(() for _ in lengths))


def plan_indices(
    method: str,
    lengths: Sequence[int],
    world_size: int,
    *,
    budget: int,
    batch_size: int = 1,
    seed: int = 0,
) -> list[list[tuple[int, ...]]]:
    """Every rank's steps as sample indices (``()`` = IDLE) under ``method``."""
    pool = permutation(len(lengths), seed)
    if method == "standard":
        return StandardPlan(batch_size)(pool, world_size, seed)
    if method == "sorted":
        return SortedPlan(batch_size, lengths)(pool, world_size, seed)
    if method == "gmt":
        return GMTPlan(odb.TokenBudget(budget), lengths)(pool, world_size, seed)
    if method == "bmt":
        return BMTPlan(odb.TokenBudget(budget), lengths)(pool, world_size, seed)
    if method == "packing":
        return PackingPlan(odb.TokenBudget(budget, "packed"), lengths)(pool, world_size, seed)
    if method == "odb":
        return _odb_indices(lengths, world_size, budget, seed)
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def _odb_indices(
    lengths: Sequence[int], world_size: int, budget: int, seed: int
) -> list[list[tuple[int, ...]]]:
    config = odb.ODBConfig(token_budget=budget, seed=seed, oversize="singleton")
    sim = simulate(list(lengths), config, world_size=world_size)
    out = []
    for rank in sim.ranks:
        groups = iter(rank.ids)
        out.append([tuple(next(groups)) if cost else () for cost in rank.costs])
    return out


@lru_cache(maxsize=256)
def schedule(
    samples: Samples,
    method: str,
    world_size: int,
    *,
    budget: int,
    batch_size: int = 1,
    seed: int = 0,
) -> Schedule:
    """The cost model's :data:`~odb.planning.step_cost.Schedule` of ``method`` (cached:
    cells that differ only in model, mode or loader options share it; read it only)."""
    plan = plan_indices(method, samples.lengths, world_size, budget=budget,
                        batch_size=batch_size, seed=seed)  # fmt: skip
    return [[[(samples.lengths[i], samples.images[i]) for i in step] for step in rank]
            for rank in plan]  # fmt: skip
