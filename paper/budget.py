"""Table + figure: token budget L_max sweep — ODB throughput vs the budget.

Speedup is against Standard at the dataset's own budget (the main grid's setting); each
L_max is judged against ODB at that budget by the claim rule (``paper.common.verdict``).
The paper: throughput grows with L_max until memory or step time dominates; its best
L_max was 12288 on UltraChat and 14336 on ShareGPT4o.

    python -m paper.budget --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    CLAIM_RULE,
    DATASET_LABEL,
    Collected,
    Run,
    by_variant,
    collect,
    figure_path,
    fixed,
    padded_per_sample,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    sort_key,
    sweep_row,
    write_table,
    yerr,
)

NAME = "budget"


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One L_max (``runs``: its seeds): timings with their spread, the verdict against
    ODB at the dataset's default budget, and the machine-independent figures."""
    budget = runs[0]["budget"]
    row, data = sweep_row(got, runs, "L_max", budget, "vs default L_max")
    row.update({
        "Padding eff.": fixed([r.result["padding_efficiency"] for r in runs], 3),
        "Budget fill": fixed([r.loader("budget_fill") for r in runs], 3),
        "Steps": fixed([r.result["steps"] for r in runs]),
        "Padded tok./sample": fixed([padded_per_sample(r) for r in runs], 1),
    })
    data["budget"] = budget
    return row, data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    odb = sorted(got.find(method="odb"), key=lambda r: (sort_key(r), r["budget"]))
    made = [_row(got, runs) for runs in by_variant(odb)]
    data = [d for _, d in made]
    write_table(
        args,
        NAME,
        pd.DataFrame([row for row, _ in made]),
        "Token budget sweep (ODB)",
        [
            "Speedup vs Standard at the dataset's default budget; vs default L_max: ODB "
            "against ODB at the default budget, per pairing. " + CLAIM_RULE,
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    for dataset in sorted({d["dataset"] for d in data}):
        pts = sorted(
            ((d["budget"], d["samples_per_s"]) for d in data if d["dataset"] == dataset),
            key=lambda p: p[0],
        )
        ax.errorbar(
            [b for b, _ in pts],
            [s["median"] for _, s in pts],
            yerr=yerr([s for _, s in pts]),
            marker="o",
            capsize=2,
            label=DATASET_LABEL[dataset],
        )
    ax.set_xlabel("token budget L_max")
    ax.set_ylabel("ODB samples/s (median, min-max)")
    if data:
        ax.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
