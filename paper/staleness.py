"""Table: length-cache staleness under augmentation — GMT/BMT vs ODB.

With random-resize augmentation a sample's length changes every epoch. GMT and BMT plan
from a cache of one epoch's draw (the cache is valid for epoch 0 only; a cache made
before the augmentation changed is refused outright by its fingerprint), so later
epochs' groups can exceed the budget (violations: memory risk) or under-fill it (wasted
capacity). ODB groups the realised lengths and needs no cache.

    python -m paper.staleness --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    collect,
    num,
    parse_args,
    scale_note,
    write_table,
)

NAME = "staleness"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    runs = sorted(
        (r for r in got.runs if r["augmented"]),
        key=lambda r: (r["dataset"], ("gmt", "bmt", "sorted", "odb").index(r["method"])),
    )
    for run in runs:
        cache = run.result.get("length_cache")
        violations = run.loader("budget_violations", 0)
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "Method": METHOD_LABEL[run["method"]],
                "Epochs": run.result["epochs"],
                "Cache build s": num(cache["build_seconds"], 1) if cache else "none",
                "Budget violations": violations,
                "Max fill": num(run.loader("max_violation_fill"), 2),
                "Budget fill": num(run.loader("budget_fill"), 3),
                "Padding eff.": num(run.result["padding_efficiency"], 3),
                "Samples/s": num(run.throughput),
            }
        )
        data.append(
            {
                "dataset": run["dataset"],
                "method": run["method"],
                "violations": violations,
                "budget_fill": run.loader("budget_fill"),
            }
        )
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Length-cache staleness under augmentation",
        [
            "Budget violations: multi-sample steps whose realised padded cost "
            "exceeded the budget (a cache-planned step that would OOM at the edge); "
            "Max fill: the worst such step's cost / budget. ODB plans from realised "
            "lengths: no violations by construction, no cache.",
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )


if __name__ == "__main__":
    main()
