"""Table + figure: token budget L_max sweep — ODB throughput vs the budget.

Speedup is against Standard at the dataset's own budget (the main grid's setting); each
L_max is judged against ODB at that budget by the claim rule (``paper.claims.verdict``).
The paper: throughput grows with L_max until memory or step time dominates; its best
L_max was 12288 on UltraChat and 14336 on ShareGPT4o.

    python -m paper.budget --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

from paper.cells import fixed, padded_per_sample, sweep_row
from paper.claims import CLAIM_RULE
from paper.common import (
    DATASET_LABEL,
    Collected,
    Run,
    figure_path,
    pyplot,
    save_figure,
    sort_key,
    yerr,
)
from paper.sweep import Sweep, run_sweep

NAME = "budget"


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One L_max (``runs``: its seeds): timings with their spread, the verdict against
    ODB at the dataset's default budget, and the machine-independent figures."""
    budget = runs[0]["budget"]
    row, data = sweep_row(got, runs, "L_max", budget, "vs default L_max")
    row.update(
        {
            "Padding eff.": fixed([r.result["padding_efficiency"] for r in runs], 3),
            "Budget fill": fixed([r.loader("budget_fill") for r in runs], 3),
            "Steps": fixed([r.result["steps"] for r in runs]),
            "Padded tok./sample": fixed([padded_per_sample(r) for r in runs], 1),
        }
    )
    data["budget"] = budget
    return row, data


def _figure(args, data: list[dict]) -> None:
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


SWEEP = Sweep(
    name=NAME,
    title="Token budget sweep (ODB)",
    note="Speedup vs Standard at the dataset's default budget; vs default L_max: ODB "
    "against ODB at the default budget, per pairing. " + CLAIM_RULE,
    row=_row,
    order=lambda r: (sort_key(r), r["budget"]),
    figure=_figure,
)


def main(argv: list[str] | None = None) -> None:
    run_sweep(SWEEP, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
