"""Table cells the paper scripts share beyond the basics: ablation sweep rows, figures that
hold across seeds, cells grouped by variant."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from paper.claims import Spread, compare, pooled
from paper.common import DATASET_LABEL, Collected, Run, group, mean_std


def sweep_row(
    got: Collected, runs: Sequence[Run], column: str, value: Any, versus: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cells every ablation sweep's row starts with (``runs``: one setting's seeds):
    dataset, setting, the swept ``column`` = ``value``, samples/s, the speedup vs Standard,
    the ratio against ODB at its default (column ``versus``) and that ratio's verdict;
    and the matching table data. A table adds its own cells to both."""
    first = runs[0]
    samples = Spread.of(pooled(runs))
    up = compare(runs, got.reference)
    vs_default = compare(runs, lambda r: got.reference(r, "odb"))
    row = {
        "Dataset": DATASET_LABEL[first["dataset"]],
        "Setting": first.setting,
        column: value,
        "Samples/s": samples.format(),
        "Speedup vs Standard": up.cell(),
        versus: vs_default.cell(),
        "Verdict vs default": vs_default.verdict,
    }
    data = {
        "dataset": first["dataset"],
        "samples_per_s": samples.to_dict(),
        "speedup": up.to_dict(),
        "vs_default": vs_default.to_dict(),
    }
    return row, data


def fixed(values: Sequence[Any], digits: int = 0) -> str:
    """A machine-independent figure over a cell's seeds: the value when they agree, else
    mean ± std; ``–`` when absent."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    if len(set(present)) == 1:
        return f"{float(present[0]):.{digits}f}"
    return mean_std(present, digits)


def by_variant(runs: Iterable[Run]) -> list[list[Run]]:
    """``runs`` grouped into cells that differ only by seed (repeats), in first-seen order."""
    groups = group(
        runs,
        lambda r: json.dumps(
            {k: v for k, v in r.cell.items() if k not in ("seed", "result", "evals")},
            sort_keys=True,
        ),
    )
    return list(groups.values())


def padded_per_sample(run: Run) -> float | None:
    """Padded tokens per emitted sample (what a sample costs under the budget's model)."""
    padded, samples = run.result.get("padded_tokens"), run.result["emitted_samples"]
    return padded / samples if padded is not None and samples else None
