"""Table + figure: training throughput (samples/s) and speedup vs Standard.

One row per dataset x setting (model, mode, nodes); one column per method with
``samples/s (speedup x)``, means over seeds. Throughput is literal: emitted training
samples over the training loop's wall-clock time. The figure draws the speedups.

    python -m paper.throughput --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    METHOD_ORDER,
    collect,
    figure_path,
    group,
    mean,
    num,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    sort_key,
    speedup,
    write_table,
)

NAME = "throughput"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    settings = group(
        sorted(got.runs, key=sort_key), lambda r: (r["dataset"], r["model"], r["mode"], r["nodes"])
    )
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in got.runs)]
    for (dataset, model, mode, nodes), runs in settings.items():
        row = {"Dataset": DATASET_LABEL[dataset], "Setting": f"{model} {mode} {nodes}N"}
        for method in methods:
            cell = [r for r in runs if r["method"] == method]
            tput = mean(r.throughput for r in cell)
            up = mean(speedup(r, got.reference(r)) for r in cell)
            row[METHOD_LABEL[method]] = "–" if not cell else f"{num(tput)} ({num(up, 2, 'x')})"
            if cell:
                data.append(
                    {
                        "dataset": dataset,
                        "model": model,
                        "mode": mode,
                        "nodes": nodes,
                        "method": method,
                        "samples_per_s": tput,
                        "speedup": up,
                        "padding_efficiency": mean(r.result["padding_efficiency"] for r in cell),
                        "seeds": len(cell),
                    }
                )
        rows.append(row)
    notes = [
        "samples/s (speedup vs Standard in the same setting); means over seeds.",
        scale_note(got.grid),
    ]
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Training throughput and speedup vs Standard",
        notes,
        got.missing,
        data,
    )
    _figure(args, data)


def _figure(args, data: list[dict]) -> None:
    plt = pyplot()
    keys = sorted(
        {(d["dataset"], d["model"], d["mode"], d["nodes"]) for d in data},
        key=lambda k: (list(DATASET_LABEL).index(k[0]), k[1:]),
    )
    methods = [m for m in METHOD_ORDER if any(d["method"] == m for d in data)]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(keys)), 3))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        ys = [
            next(
                (
                    d["speedup"]
                    for d in data
                    if d["method"] == method
                    and (d["dataset"], d["model"], d["mode"], d["nodes"]) == k
                ),
                0.0,
            )
            for k in keys
        ]
        ax.bar([x + i * width for x in range(len(keys))], ys, width, label=METHOD_LABEL[method])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels([f"{DATASET_LABEL[k[0]]}\n{k[1]} {k[2]} {k[3]}N" for k in keys], fontsize=7)
    ax.set_ylabel("speedup vs Standard")
    if data:
        ax.legend(fontsize=7, ncol=3)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
