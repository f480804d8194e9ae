"""Error of ``ODBLoader.estimate_steps()`` during an epoch, on the paper-shaped lengths.

Runs a real ``ODBLoader`` epoch (thread mode, W=1: the estimate uses global counts, so
W only changes the step sequence) over samples of the drawn lengths, records
``estimate_steps()`` after every step, and reports its relative error at 5, 10, 25, 50
and 75% of the epoch's steps, beside the naive estimate ``k / progress()`` (samples).

    .venv/bin/python -m bench.estimate_steps --out results/bench/estimate_steps.json
"""

from __future__ import annotations

import torch

import odb
from bench import _io
from bench.distributions import NAMES, lengths

CHECKPOINTS = (0.05, 0.10, 0.25, 0.50, 0.75)


class LengthDataset:
    """Sample ``i``: ``sizes[i]`` tokens, every label counted."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.ones(self.sizes[index], dtype=torch.long)
        return {"input_ids": ids, "labels": ids}


def estimate_errors(sizes: list[int], budget: int) -> dict[str, dict[str, float]]:
    loader = odb.ODBLoader(LengthDataset(sizes), token_budget=budget, collate_mode="thread")
    token_based, sample_based = [], []
    for k, batch in enumerate(loader, start=1):
        odb.pop_step_info(batch)
        token_based.append(loader.estimate_steps())
        sample_based.append(round(k / loader.progress()))
    steps = len(token_based)
    out: dict[str, dict[str, float]] = {"estimate_steps": {}, "k_over_progress": {}}
    for fraction in CHECKPOINTS:
        k = max(1, round(fraction * steps))
        label = f"at_{int(100 * fraction)}pct"
        out["estimate_steps"][label] = round(token_based[k - 1] / steps - 1, 4)
        out["k_over_progress"][label] = round(sample_based[k - 1] / steps - 1, 4)
    out["steps"] = {"epoch": steps}
    return out


def main() -> None:
    parser = _io.parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    results = {}
    for name in NAMES:
        for budget in (8192, 16384):
            _io.progress(f"{name} budget {budget}")
            sizes = [int(x) for x in lengths(name, 4000, seed=0)]
            results[f"{name}/{budget}"] = estimate_errors(sizes, budget)
    _io.emit(
        {"benchmark": "estimate_steps", "machine": _io.machine(), "relative_error": results},
        args.out,
    )


if __name__ == "__main__":
    main()
