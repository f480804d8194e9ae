"""Table: termination mode — join (identity coverage) vs non-join (quota closure).

With ``join=True`` a rank that has read its view keeps aligning (IDLE steps) until all
are done: every sample is emitted once per epoch. With ``join=False`` the epoch ends
when the first rank runs out and the buffered rest is carried into the next epoch.

    python -m paper.join --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import DATASET_LABEL, collect, num, parse_args, scale_note, speedup, write_table

NAME = "join"


def _join(run) -> bool:
    return bool(run.result["config"]["method"].get("odb", {}).get("join", True))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    for run in sorted(got.find(method="odb"), key=lambda r: (r["dataset"], not _join(r))):
        up = speedup(run, got.reference(run))
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "Join": "yes" if _join(run) else "no",
                "Samples/s": num(run.throughput),
                "Speedup vs Standard": num(up, 2, "x"),
                "Emitted samples": run.result["emitted_samples"],
                "Carried": run.loader("carried", "–"),
                "Steps": run.result["steps"],
                "IDLE %": num(100 * run.result["idle_fraction"], 2),
            }
        )
        data.append(
            {
                "dataset": run["dataset"],
                "join": _join(run),
                "speedup": up,
                "emitted": run.result["emitted_samples"],
            }
        )
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Termination: join vs non-join",
        [
            "Carried: samples buffered at the epoch's end, emitted in the next epoch (non-join).",
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )


if __name__ == "__main__":
    main()
