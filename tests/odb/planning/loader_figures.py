"""The real loader's figures of one epoch, for comparison with odb.plan's forecast."""

from __future__ import annotations

from typing import Any

import odb
from harness.scenarios import LengthDataset

FIGURES = ("steps", "idle_steps", "real_tokens", "padded_tokens")


def epoch_figures(
    rank: int, world_size: int, datasets: dict[str, list[int]], options: dict[str, Any]
) -> dict[str, dict[str, int]]:
    """Per dataset (its lengths): this rank's steps, IDLE steps and tokens of epoch 0."""
    out = {}
    for name, lengths in datasets.items():
        loader = odb.ODBLoader(LengthDataset(lengths), **options)
        steps = sum(1 for _ in loader)
        stats = loader.stats()
        out[name] = {key: int(stats[key]) for key in FIGURES}
        assert out[name]["steps"] == steps
    return out


def summed(per_rank: list[dict[str, int]]) -> dict[str, int]:
    """The ranks' figures as the plan reports them: steps (equal on every rank, checked)
    and the other counts summed over ranks."""
    steps = {r["steps"] for r in per_rank}
    assert len(steps) == 1, f"ranks disagree on the step count: {steps}"
    return {"steps": steps.pop(), **{k: sum(r[k] for r in per_rank) for k in FIGURES[1:]}}
