"""Table: the length-cache cost of the offline oracles (GMT/BMT) next to ODB.

GMT and BMT pay one full preprocessing pass (the cache build, timed by
``baselines.length_cache``) before training, and again after every change of data,
template, tokenizer, cutoff, processor or augmentation; ODB needs no cache. Throughput
"incl. cache" charges the build to the run: samples / (train time + build time).

    python -m paper.cache --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    collect,
    num,
    parse_args,
    scale_note,
    sort_key,
    write_table,
)

NAME = "cache"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    for run in sorted(got.runs, key=sort_key):
        cache = run.result.get("length_cache") or {}
        build = float(cache.get("build_seconds", 0.0))
        wall = float(run.result["train_wall_s"])
        samples = run.result["emitted_samples"]
        incl = samples / (wall + build) if wall + build > 0 else float("nan")
        rows.append(
            {
                "Dataset": DATASET_LABEL[run["dataset"]],
                "Setting": run.setting,
                "Method": METHOD_LABEL[run["method"]],
                "Cache build s": num(build, 1) if cache else "none",
                "Train s": num(wall, 1),
                "Samples/s": num(run.throughput),
                "Samples/s incl. cache": num(incl),
                "Cache share %": num(100 * build / (wall + build), 1) if cache else "0",
            }
        )
        data.append(
            {
                "cell": run.name,
                "method": run["method"],
                "dataset": run["dataset"],
                "build_seconds": build,
                "train_seconds": wall,
            }
        )
    notes = [
        "The cache is rebuilt after any change that alters lengths (the fingerprint "
        "refuses a stale one); ODB forms groups from realised lengths and needs none.",
        scale_note(got.grid),
    ]
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Length-cache cost: GMT/BMT vs ODB",
        notes,
        got.missing,
        data,
    )


if __name__ == "__main__":
    main()
