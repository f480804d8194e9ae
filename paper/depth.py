"""Table + figure: outstanding depth D sweep with the measured pipeline overlap.

D = DataLoader workers x prefetch_factor (requests in flight; torch's default factor is
2). Pipeline overlap = 1 - (trainer's data-wait time / training wall time): the share of
the loop not spent waiting for data. The paper: past ~95% overlap, a larger D buys
little.

    python -m paper.depth --grid results/paper/grid.json --out-dir results/paper
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
    speedup,
    write_table,
)

NAME = "depth"


def depth(run) -> int:
    method = run.result["config"]["method"]
    factor = method.get("odb", {}).get("prefetch_factor") or 2
    return max(1, method.get("num_workers", 0)) * factor


def overlap(run) -> float:
    wall = float(run.result["train_wall_s"])
    return 1.0 - float(run.result["data_wait_s"]) / wall if wall > 0 else float("nan")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    for run in sorted(got.find(method="odb"), key=lambda r: (r["dataset"], depth(r))):
        up = speedup(run, got.reference(run))
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "D": depth(run),
                "Samples/s": num(run.throughput),
                "Speedup vs Standard": num(up, 2, "x"),
                "Data wait s": num(run.result["data_wait_s"], 2),
                "Overlap %": num(100 * overlap(run), 1),
            }
        )
        data.append(
            {
                "dataset": run["dataset"],
                "depth": depth(run),
                "samples_per_s": run.throughput,
                "overlap": overlap(run),
            }
        )
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Outstanding depth D sweep (ODB)",
        [
            "D = workers x prefetch_factor; overlap = 1 - data wait / train time.",
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3))
    for dataset in sorted({d["dataset"] for d in data}):
        pts = sorted(
            (d["depth"], d["samples_per_s"], d["overlap"]) for d in data if d["dataset"] == dataset
        )
        left.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker="o", label=DATASET_LABEL[dataset]
        )
        right.plot(
            [p[0] for p in pts], [100 * p[2] for p in pts], marker="o", label=DATASET_LABEL[dataset]
        )
    left.set(xlabel="outstanding depth D", ylabel="ODB samples/s", xscale="log")
    right.set(xlabel="outstanding depth D", ylabel="pipeline overlap %", xscale="log")
    if data:
        left.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
