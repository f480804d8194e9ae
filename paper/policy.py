"""Table: DGAP target policy — ``paper`` (max-based bidirectional) vs ``balanced``.

Same data, budget and seed; only ``method.odb.policy`` differs. IDLE steps, recirculated
samples and alignment round latency show what each policy costs.

    python -m paper.policy --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import DATASET_LABEL, collect, num, parse_args, scale_note, speedup, write_table

NAME = "policy"


def _policy(run) -> str:
    return run.result["config"]["method"].get("odb", {}).get("policy", "balanced")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    for run in sorted(got.find(method="odb"), key=lambda r: (r["dataset"], _policy(r))):
        up = speedup(run, got.reference(run))
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "Policy": _policy(run),
                "Samples/s": num(run.throughput),
                "Speedup vs Standard": num(up, 2, "x"),
                "Steps": run.result["steps"],
                "IDLE %": num(100 * run.result["idle_fraction"], 2),
                "Recirculated": run.loader("recirculated", "–"),
                "Round ms": num(run.loader("mean_round_ms"), 1),
                "Val loss": num((run.result.get("validation") or {}).get("loss"), 3),
            }
        )
        data.append({"dataset": run["dataset"], "policy": _policy(run), "speedup": up})
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Target policy: paper vs balanced",
        [scale_note(got.grid)],
        got.missing,
        data,
    )


if __name__ == "__main__":
    main()
