"""What the forecast means for a user: which budget, what to watch, whether ODB pays.

The recommendation is, per world size, the smallest budget whose predicted throughput is
within :data:`NEAR_BEST` of the best candidate's (a smaller budget needs less memory and
keeps more steps per epoch for the same speed), among the budgets the memory probe
allowed when it ran. ODB does not pay when the lengths are nearly equal: a fixed batch
then pads almost nothing, and grouping by length has nothing to gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NEAR_BEST = 0.02  # within 2 % of the best predicted throughput
IDLE_WARNING = 0.01  # IDLE steps above 1 % of all steps
UNIFORM_CV = 0.05  # below this CV the lengths are called nearly identical
MIN_GAIN = 1.02  # a predicted speed-up below this at every budget is no gain

Row = Mapping[str, Any]


def recommend(rows: Sequence[Row], max_budget: int | None = None) -> dict[int, dict[str, Any]]:
    """Per world size: the recommended budget and the reason, in words."""
    out: dict[int, dict[str, Any]] = {}
    for world_size in sorted({row["world_size"] for row in rows}):
        mine = [r for r in rows if r["world_size"] == world_size]
        allowed = [r for r in mine if max_budget is None or r["budget"] <= max_budget]
        if not allowed:
            out[world_size] = {"budget": None, "reason": _none_fits(mine, max_budget)}
            continue
        best = min(r["epoch_cost"] for r in allowed)
        near = [r for r in allowed if r["epoch_cost"] <= best / (1 - NEAR_BEST)]
        pick = min(near, key=lambda r: r["budget"])
        out[world_size] = {"budget": pick["budget"], "reason": _reason(pick, best, max_budget)}
    return out


def _none_fits(rows: Sequence[Row], max_budget: int | None) -> str:
    smallest = min(r["budget"] for r in rows)
    return (
        f"no candidate budget fits: the memory probe allows at most {max_budget} tokens, "
        f"the smallest candidate is {smallest}; give smaller budgets"
    )


def _reason(pick: Row, best: float, max_budget: int | None) -> str:
    share = best / pick["epoch_cost"] if pick["epoch_cost"] else 1.0
    memory = "" if max_budget is None else f" and within the probed memory limit {max_budget}"
    return (
        f"the smallest budget within {NEAR_BEST:.0%} of the best predicted throughput "
        f"({share:.1%} of it){memory}; predicted x{pick['speedup_vs_standard']:.2f} vs a "
        f"fixed batch of {pick['standard_batch_size']} at the cutoff, padding efficiency "
        f"{pick['padding_efficiency']:.1%} vs {pick['standard_padding_efficiency']:.1%}"
    )


def warnings_for(rows: Sequence[Row], stats: Row) -> list[str]:
    """Oversize samples, world sizes that idle, and data ODB cannot help."""
    found: list[str] = []
    for budget in sorted({r["budget"] for r in rows}):
        oversize = next(r["oversize"] for r in rows if r["budget"] == budget)
        if oversize:
            found.append(
                f"budget {budget}: {oversize} measured samples are longer than the budget "
                "on their own; each becomes a step of one sample (oversize='singleton'). "
                "Raise the budget or truncate them"
            )
    for row in rows:
        if row["idle_fraction"] > IDLE_WARNING:
            found.append(
                f"budget {row['budget']} at {row['world_size']} ranks: IDLE steps are "
                f"{row['idle_fraction']:.1%} of all steps (ranks with nothing left wait for "
                "the others); a larger dataset per rank or fewer ranks lowers it"
            )
    verdict = uniform_verdict(rows, stats)
    if verdict is not None:
        found.append(verdict)
    return found


def uniform_verdict(rows: Sequence[Row], stats: Row) -> str | None:
    """The plain answer when ODB will not help, with the reason; None when it may."""
    best_gain = max(r["speedup_vs_standard"] for r in rows)
    if stats["cv"] >= UNIFORM_CV and best_gain >= MIN_GAIN:
        return None
    return (
        f"ODB will not help on this data: the lengths are nearly identical (CV "
        f"{stats['cv']:.2f}, p50 {stats['p50']}, p99 {stats['p99']}), so a fixed batch of "
        "the largest size that fits the budget already pads almost nothing, and grouping "
        f"by length has nothing to gain (best predicted speed-up x{best_gain:.2f})"
        if stats["cv"] < UNIFORM_CV
        else f"ODB will not help on this data: the best predicted speed-up is "
        f"x{best_gain:.2f} at these budgets (CV {stats['cv']:.2f}); fixed batches pad "
        "little here"
    )
