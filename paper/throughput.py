"""Table + figure: training throughput (samples/s) and speedup vs Standard.

One row per dataset x setting (model, mode, nodes) x method. Samples/s is the median
and range of the cell's measurements (``paper.claims.measurements``: each whole epoch
after the warm-up, over every seed); the speedup is computed per pairing with Standard
in the same setting (same seed, epoch k with epoch k) and shown with its range; the
verdict follows the claim rule (``paper.claims.verdict``). Next to the timings, the
machine-independent figures that decide throughput on a GPU: steps, padding efficiency,
padded tokens per sample, IDLE steps and budget fill. The figure draws the median
speedups with their ranges.

    python -m paper.throughput --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import math

import pandas as pd

from paper.cells import fixed, padded_per_sample
from paper.claims import CLAIM_RULE, Spread, compare, pooled
from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    METHOD_ORDER,
    Collected,
    Run,
    collect,
    figure_path,
    group,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    sort_key,
    write_table,
    yerr,
)

NAME = "throughput"


def _cell(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """The row and the data of one method in one setting (``runs``: its seeds)."""
    first = runs[0]
    method = first["method"]
    samples = Spread.of(pooled(runs))
    up = compare(runs, got.reference)
    figures = {
        "steps": [r.result["steps"] for r in runs],
        "padding_efficiency": [r.result["padding_efficiency"] for r in runs],
        "padded_per_sample": [padded_per_sample(r) for r in runs],
        "idle_steps": [r.result.get("idle_steps") for r in runs],
        "budget_fill": [r.loader("budget_fill") for r in runs],
    }
    row = {
        "Dataset": DATASET_LABEL[first["dataset"]],
        "Setting": first.setting,
        "Method": METHOD_LABEL[method],
        "Samples/s": samples.format(),
        "Speedup vs Standard": up.cell(),
        "Verdict": up.verdict,
        "Steps": fixed(figures["steps"]),
        "Padding eff.": fixed(figures["padding_efficiency"], 3),
        "Padded tok./sample": fixed(figures["padded_per_sample"], 1),
        "IDLE steps": fixed(figures["idle_steps"]),
        "Budget fill": fixed(figures["budget_fill"], 3),
    }
    data = {
        **{k: first[k] for k in ("dataset", "model", "mode", "nodes", "method")},
        "seeds": len(runs),
        "samples_per_s": samples.to_dict(),
        "speedup": up.to_dict(),
        **{k: _mean(v) for k, v in figures.items()},
    }
    return row, data


def _mean(values: list) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    cells = group(
        sorted(got.runs, key=sort_key),
        lambda r: (r["dataset"], r["model"], r["mode"], r["nodes"], r["method"]),
    )
    made = [_cell(got, runs) for runs in cells.values()]
    notes = [
        "Samples/s: median [min-max] n=measurements (each whole epoch after the warm-up "
        "epoch, over seeds; one whole-run figure where a run timed fewer than 2 epochs). "
        "Speedup: per pairing with Standard (same seed, epoch k with epoch k). " + CLAIM_RULE,
        "Steps, padding efficiency, padded tokens per sample, IDLE steps and budget fill "
        "do not depend on the machine; samples/s does.",
        scale_note(got.grid),
    ]
    write_table(
        args,
        NAME,
        pd.DataFrame([row for row, _ in made]),
        "Training throughput and speedup vs Standard",
        notes,
        got.missing,
        [data for _, data in made],
    )
    _figure(args, [data for _, data in made])


def _figure(args, data: list[dict]) -> None:
    plt = pyplot()
    keys = sorted(
        {(d["dataset"], d["model"], d["mode"], d["nodes"]) for d in data},
        key=lambda k: (list(DATASET_LABEL).index(k[0]), k[1:]),
    )
    methods = [m for m in METHOD_ORDER[1:] if any(d["method"] == m for d in data)]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(keys)), 3))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        ups = {
            (d["dataset"], d["model"], d["mode"], d["nodes"]): d["speedup"]
            for d in data
            if d["method"] == method and d["speedup"] and d["speedup"]["n"]
        }
        mids = [ups[k]["median"] if k in ups else math.nan for k in keys]
        errs = yerr([ups.get(k) for k in keys])
        xs = [x + i * width for x in range(len(keys))]
        ax.bar(xs, mids, width, yerr=errs, capsize=2, label=METHOD_LABEL[method])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels([f"{DATASET_LABEL[k[0]]}\n{k[1]} {k[2]} {k[3]}N" for k in keys], fontsize=7)
    ax.set_ylabel("speedup vs Standard (median, min-max)")
    if methods:
        ax.legend(fontsize=7, ncol=3)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
