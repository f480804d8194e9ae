"""Table + figure: token budget L_max sweep — ODB throughput vs the budget.

Speedup is against Standard at the dataset's own budget (the main grid's setting).
The paper: throughput grows with L_max until memory or step time dominates; its best
L_max was 12288 on UltraChat and 14336 on ShareGPT4o.

    python -m paper.budget --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    DATASET_LABEL,
    collect,
    figure_path,
    num,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    sort_key,
    speedup,
    write_table,
)

NAME = "budget"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    for run in sorted(got.find(method="odb"), key=lambda r: (sort_key(r), r["budget"])):
        up = speedup(run, got.reference(run))
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "L_max": run["budget"],
                "Samples/s": num(run.throughput),
                "Speedup vs Standard": num(up, 2, "x"),
                "Padding eff.": num(run.result["padding_efficiency"], 3),
                "Budget fill": num(run.loader("budget_fill"), 3),
                "Steps": run.result["steps"],
            }
        )
        data.append(
            {
                "dataset": run["dataset"],
                "budget": run["budget"],
                "samples_per_s": run.throughput,
                "speedup": up,
            }
        )
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Token budget sweep (ODB)",
        ["Speedup vs Standard at the dataset's default budget.", scale_note(got.grid)],
        got.missing,
        data,
    )
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    for dataset in sorted({d["dataset"] for d in data}):
        pts = sorted((d["budget"], d["samples_per_s"]) for d in data if d["dataset"] == dataset)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=DATASET_LABEL[dataset])
    ax.set_xlabel("token budget L_max")
    ax.set_ylabel("ODB samples/s")
    if data:
        ax.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
