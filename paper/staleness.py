"""Table: length-cache staleness under augmentation — GMT/BMT vs ODB.

With random-resize augmentation a sample's length changes every epoch. GMT and BMT plan
from a cache of one epoch's draw (the cache is valid for epoch 0 only; a cache made
before the augmentation changed is refused outright by its fingerprint), so later
epochs' groups can exceed the budget (violations: memory risk) or under-fill it (wasted
capacity). ODB groups the realised lengths and needs no cache. The finding is the
violations and the fill (machine independent); samples/s is shown with its spread and
judged against ODB's by the claim rule (``paper.claims.verdict``).

    python -m paper.staleness --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

from paper.cells import fixed
from paper.claims import CLAIM_RULE, Spread, build_seconds, compare, pooled
from paper.common import DATASET_LABEL, METHOD_LABEL, Collected, Run
from paper.sweep import Sweep, run_sweep

NAME = "staleness"
ORDER = ("gmt", "bmt", "sorted", "odb")


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One method under augmentation (``runs``: its seeds): the cache's cost in
    violations and fill, and its samples/s against ODB's in the same cell."""
    first = runs[0]
    caches = [r.result.get("length_cache") for r in runs]
    violations = [r.loader("budget_violations", 0) for r in runs]
    samples = Spread.of(pooled(runs))
    vs_odb = compare(runs, lambda r: got.counterpart(r, method="odb"))
    row = {
        "Dataset": DATASET_LABEL[first["dataset"]],
        "Setting": first.setting,
        "Method": METHOD_LABEL[first["method"]],
        "Epochs": fixed([r.result["epochs"] for r in runs]),
        "Cache build s": Spread.of(s for r in runs for s in build_seconds(r)).format(1)
        if any(caches)
        else "none",
        "Budget violations": fixed(violations),
        "Max fill": fixed([r.loader("max_violation_fill") for r in runs], 2),
        "Budget fill": fixed([r.loader("budget_fill") for r in runs], 3),
        "Padding eff.": fixed([r.result["padding_efficiency"] for r in runs], 3),
        "Samples/s": samples.format(),
        "vs ODB": vs_odb.cell(),
        "Verdict vs ODB": vs_odb.verdict,
    }
    data = {
        "dataset": first["dataset"],
        "method": first["method"],
        "violations": sum(violations) / len(violations),
        "budget_fill": first.loader("budget_fill"),
        "samples_per_s": samples.to_dict(),
        "vs_odb": vs_odb.to_dict(),
    }
    return row, data


SWEEP = Sweep(
    name=NAME,
    title="Length-cache staleness under augmentation",
    note="Budget violations: multi-sample steps whose realised padded cost "
    "exceeded the budget (a cache-planned step that would OOM at the edge); "
    "Max fill: the worst such step's cost / budget. ODB plans from realised "
    "lengths: no violations by construction, no cache. Cache build s: one "
    "figure per run. vs ODB: samples/s against ODB's in the same cell, per "
    "pairing. " + CLAIM_RULE,
    row=_row,
    order=lambda r: (r["dataset"], ORDER.index(r["method"])),
    select=lambda got: (r for r in got.runs if r["augmented"]),
)


def main(argv: list[str] | None = None) -> None:
    run_sweep(SWEEP, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
