"""odb.plan's forecast against what was measured: the GPU-proxy training runs.

The two GPU-proxy runs (``docs/gpu/gpu_{sharegpt4o,mmmix}.json``: one H200, a 166M
random-init Qwen3 text model, bf16, Standard's batch of 2 at the 8192 cutoff vs
``ODBLoader(token_budget=16384)``, lengths ``bench.distributions.lengths(name, n, seed=1)``)
are planned again here over the same lengths, W = 1, budget 16384, cutoff 8192.

Compared: steps and padding efficiency (ODB and Standard), and the speed-up under three
step costs: the default ``StepCost()``; the one each run implies (``a`` and ``b`` solved
from its two measured epochs, Standard's and ODB's: two equations, two unknowns); and the
one the *other* run implies (an out-of-sample prediction).

    python -m bench.plan_validation --out docs/bench/plan_validation.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import odb
from bench import _io
from bench.distributions import CUTOFF, lengths

RUNS = {
    "sharegpt4o": Path("docs/gpu/gpu_sharegpt4o.json"),
    "mmmix": Path("docs/gpu/gpu_mmmix.json"),
}
BUDGET = 16384


class _Lengths(torch.utils.data.Dataset):
    """Samples of the given lengths (token ids only: all the plan reads)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(self.sizes[index], dtype=torch.long)}


def implied_step_cost(run: dict[str, Any]) -> odb.planning.StepCost:
    """``a`` and ``b`` of ``wall = a * steps + b * padded_tokens`` from the run's two
    epochs (Standard and ODB, same samples)."""
    rows = []
    for method in ("standard", "odb"):
        r = run["results"][method]
        real = r["real_tokens_per_s"] * r["wall_s"]
        rows.append((r["steps"], real / r["padding_efficiency"], r["wall_s"]))
    (s1, p1, w1), (s2, p2, w2) = rows
    det = s1 * p2 - s2 * p1
    return odb.planning.StepCost(a=(w1 * p2 - w2 * p1) / det, b=(s1 * w2 - s2 * w1) / det)


def forecast(name: str, run: dict[str, Any], cost: odb.planning.StepCost) -> dict[str, Any]:
    sizes = [int(n) for n in lengths(name, run["samples"], seed=1)]
    report = odb.plan(_Lengths(sizes), budgets=[BUDGET], world_sizes=[1], cutoff=CUTOFF,
                      num_samples=None, progress=False, step_cost=cost)  # fmt: skip
    return report.rows[0]


def validate(name: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    run = runs[name]
    other = next(n for n in runs if n != name)
    measured = run["results"]
    costs = {
        "default": odb.planning.StepCost(),
        "implied by this run": implied_step_cost(run),
        f"implied by the {other} run": implied_step_cost(runs[other]),
    }
    rows = {label: forecast(name, run, cost) for label, cost in costs.items()}
    first = next(iter(rows.values()))
    return {
        "dataset": name,
        "samples": run["samples"],
        "measured": {
            "odb_steps": measured["odb"]["steps"],
            "standard_steps": measured["standard"]["steps"],
            "odb_padding_efficiency": measured["odb"]["padding_efficiency"],
            "standard_padding_efficiency": measured["standard"]["padding_efficiency"],
            "speedup": run["odb_speedup_vs_standard"],
        },
        "predicted": {
            "odb_steps": first["steps"],
            "standard_steps": first["standard_steps"],
            "odb_padding_efficiency": first["padding_efficiency"],
            "standard_padding_efficiency": first["standard_padding_efficiency"],
            "speedup": {label: row["speedup_vs_standard"] for label, row in rows.items()},
        },
        "step_costs": {
            label: {"a": c.a, "b": c.b, "a_in_tokens": round(c.a / c.b)}
            for label, c in costs.items()
        },  # fmt: skip
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _io.parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    runs = {name: json.loads(path.read_text()) for name, path in RUNS.items()}
    result = {
        "benchmark": "plan_validation",
        "machine": _io.machine(),
        "budget": BUDGET,
        "cutoff": CUTOFF,
        "datasets": [validate(name, runs) for name in RUNS],
    }
    _io.emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
