"""One cell on fresh ranks, its memory sampled, summarised from its ranks' records."""

from __future__ import annotations

from typing import Any

from bench.real_pipeline.memory import TreeMemorySampler
from bench.real_pipeline.rank import OFFLINE_ENV, CellSpec, rank_cell
from harness.ranks import run_ranks


def run_cell(
    spec: CellSpec,
    world: int,
    mem_interval_s: float,
    timeout_s: float,
    smaps_interval_s: float = 0.0,
) -> dict:
    """Run one (proxy, W, loader) cell on ``world`` fresh ranks; summarise it."""
    with TreeMemorySampler(mem_interval_s, smaps_interval_s) as mem:
        ranks = run_ranks(rank_cell, world, spec, timeout=timeout_s, env=OFFLINE_ENV)
    return summarise(ranks) | mem.result()


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell's numbers from its ranks' records (sums, or the slowest rank)."""
    per_rank_wall = [sum(e["wall_s"] for e in r["epochs"]) for r in ranks]
    samples = sum(e["samples"] for r in ranks for e in r["epochs"])
    real = sum(e["real_tokens"] for r in ranks for e in r["epochs"])
    padded = sum(e["padded_tokens"] for r in ranks for e in r["epochs"])
    epochs = len(ranks[0]["epochs"])
    wall = max(per_rank_wall)
    out: dict[str, Any] = {
        "samples": samples,
        "samples_per_s": round(samples / wall, 2) if wall > 0 else None,
        "wall_s": round(wall, 3),
        "samples_per_s_per_epoch": [_epoch_rate(ranks, e) for e in range(epochs)],
        "first_batch_s": max(r["epochs"][0]["first_batch_s"] or 0.0 for r in ranks),
        "first_batch_s_per_epoch": [
            max(r["epochs"][e]["first_batch_s"] or 0.0 for r in ranks) for e in range(epochs)
        ],
        "steps": max(sum(e["steps"] for e in r["epochs"]) for r in ranks),
        "idle_steps": sum(e["idle_steps"] for r in ranks for e in r["epochs"]),
        "padding_efficiency": round(real / padded, 4) if padded else None,
        "real_tokens": real,
        "padded_tokens": padded,
        "uss_before_iter_mb": round(sum(r["uss_before_iter_mb"] for r in ranks), 1),
        "collate_cpu_us_per_sample": _collate_cpu_us(ranks, samples),
        "per_rank": [
            {
                "rank": r["rank"],
                "samples": sum(e["samples"] for e in r["epochs"]),
                "wall_s": round(w, 3),
                "samples_per_s": round(sum(e["samples"] for e in r["epochs"]) / w, 2)
                if w > 0
                else None,
                "epochs": r["epochs"],
            }
            for r, w in zip(ranks, per_rank_wall, strict=True)
        ],
    }
    return out


def _epoch_rate(ranks: list[dict[str, Any]], epoch: int) -> float | None:
    """Epoch ``epoch``'s samples of all ranks / its slowest rank's wall clock (from iter())."""
    wall = max(r["epochs"][epoch]["wall_s"] for r in ranks)
    samples = sum(r["epochs"][epoch]["samples"] for r in ranks)
    return round(samples / wall, 2) if wall > 0 else None


def _collate_cpu_us(ranks: list[dict[str, Any]], samples: int) -> float | None:
    """The collate side's CPU microseconds per emitted sample (odb cells; else None)."""
    stats = [e["odb_stats"] for r in ranks for e in r["epochs"] if "odb_stats" in e]
    if not stats or not samples:
        return None
    return round(1e6 * sum(s["collate_cpu_s"] for s in stats) / samples, 1)
