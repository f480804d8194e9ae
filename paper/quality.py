"""Table: quality of each checkpoint — validation loss, MMLU, MMMU-MC, MMMU generated.

Validation loss comes from ``python -m eval.val_loss`` (falling back to the train run's
own end-of-training value, the same protocol, where no evaluation was run); accuracies
are percentages, means ± std over seeds. MMMU generated shows the unparsed answers too
(format drift: the paper's Sorted on LLaVA fell to 5.52% against Standard's 22.30%).

    python -m paper.quality --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    collect,
    group,
    mean,
    mean_std,
    parse_args,
    scale_note,
    sort_key,
    write_table,
)

NAME = "quality"


def _val_loss(run) -> float | None:
    if "val_loss" in run.evals:
        return run.evals["val_loss"]["metrics"]["loss"]
    validation = run.result.get("validation")
    return validation["loss"] if validation else None


def _acc(run, benchmark: str) -> float | None:
    ev = run.evals.get(benchmark)
    return None if ev is None or ev.get("accuracy") is None else ev["accuracy"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME, evals=True)
    rows, data = [], []
    cells = group(
        sorted(got.runs, key=sort_key),
        lambda r: (r["dataset"], r["model"], r["mode"], r["nodes"], r["method"]),
    )
    for (dataset, model, mode, nodes, method), runs in cells.items():
        losses = [_val_loss(r) for r in runs]
        accs = {
            b: [_acc(r, b) for r in runs if _acc(r, b) is not None]
            for b in ("mmlu", "mmmu_mc", "mmmu_gen")
        }
        unparsed = [
            r.evals["mmmu_gen"]["metrics"].get("unparsed") for r in runs if "mmmu_gen" in r.evals
        ]
        rows.append(
            {
                "Dataset": DATASET_LABEL[dataset],
                "Setting": f"{model} {mode} {nodes}N",
                "Method": METHOD_LABEL[method],
                "Val loss": mean_std(losses, 3),
                "MMLU %": mean_std(accs["mmlu"], 2, 100),
                "MMMU-MC %": mean_std(accs["mmmu_mc"], 2, 100),
                "MMMU gen %": mean_std(accs["mmmu_gen"], 2, 100),
                "Gen unparsed": mean_std([u for u in unparsed if u is not None], 1),
            }
        )
        data.append(
            {
                "dataset": dataset,
                "model": model,
                "mode": mode,
                "nodes": nodes,
                "method": method,
                "val_loss": mean(v for v in losses if v is not None),
                **{b: mean(v) if v else None for b, v in accs.items()},
            }
        )
    notes = [
        "Accuracies in %, means ± std over seeds; – where the benchmark does not apply "
        "(MMLU: text dataset; MMMU: multimodal datasets).",
        scale_note(got.grid),
    ]
    if got.grid["scale"] != "paper":
        notes.append(
            "_At CPU-proxy scale the benchmark scores of a ~1M-parameter random "
            "model are pipeline checks, never quality claims._"
        )
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Quality: validation loss and benchmarks",
        notes,
        got.missing,
        data,
    )


if __name__ == "__main__":
    main()
