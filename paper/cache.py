"""Table: the length-cache cost of the offline oracles (GMT/BMT) next to ODB.

GMT and BMT pay one full preprocessing pass (the cache build, timed by
``baselines.length_cache``) before training, and again after every change of data,
template, tokenizer, cutoff, processor or augmentation; ODB needs no cache. Throughput
"incl. cache" charges the build to the run: samples / (train time + build time), per
measurement (``with_cache``), and is judged against ODB's samples/s by the claim rule
(``paper.claims.verdict``).

    python -m paper.cache --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.cells import by_variant
from paper.claims import CLAIM_RULE, Spread, build_seconds, compare, epoch_seconds, pooled
from paper.common import (
    DATASET_LABEL,
    METHOD_LABEL,
    Collected,
    Run,
    collect,
    parse_args,
    scale_note,
    sort_key,
    write_table,
)

NAME = "cache"


def _build(run: Run) -> float:
    return float((run.result.get("length_cache") or {}).get("build_seconds", 0.0))


def with_cache(run: Run) -> list[float]:
    """The run's measurements with the cache build charged to them: each sample pays
    ``build / emitted samples`` seconds on top of its measured time, so the build is
    spread over the run's samples (over a whole run: samples / (train + build time))."""
    per_sample = _build(run) / max(run.result["emitted_samples"], 1)
    return [1.0 / (1.0 / m + per_sample) for m in pooled([run])]


def cache_share(run: Run) -> list[float]:
    """Per measurement, the percentage of a sample's time that is its share of the build."""
    per_sample = _build(run) / max(run.result["emitted_samples"], 1)
    return [100 * per_sample / (1.0 / m + per_sample) for m in pooled([run])]


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One method (``runs``: its seeds): the build's passes and the timed epochs' seconds,
    samples/s with and without the build, and the verdict against ODB's samples/s."""
    first = runs[0]
    cached = first.result.get("length_cache") is not None
    walls = Spread.of(s for r in runs for s in epoch_seconds(r))
    builds = Spread.of(s for r in runs for s in build_seconds(r))
    incl = Spread.of(m for r in runs for m in with_cache(r))
    vs_odb = compare(runs, lambda r: got.counterpart(r, method="odb"), with_cache)
    share = Spread.of(s for r in runs for s in cache_share(r))
    row = {
        "Dataset": DATASET_LABEL[first["dataset"]],
        "Setting": first.setting,
        "Method": METHOD_LABEL[first["method"]],
        "Cache build s": builds.format(1) if cached else "none",
        "Epoch s": walls.format(1),
        "Samples/s": Spread.of(pooled(runs)).format(),
        "Samples/s incl. cache": incl.format(),
        "incl. cache vs ODB": vs_odb.cell(),
        "Verdict vs ODB": vs_odb.verdict,
        "Cache share %": share.format(1) if cached else "0",
    }
    data = {
        "cell": first.name,
        "method": first["method"],
        "dataset": first["dataset"],
        "build_seconds": builds.to_dict(),
        "epoch_seconds": walls.to_dict(),
        "samples_per_s_incl_cache": incl.to_dict(),
        "vs_odb": vs_odb.to_dict(),
    }
    return row, data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    made = [_row(got, runs) for runs in by_variant(sorted(got.runs, key=sort_key))]
    notes = [
        "The cache is rebuilt after any change that alters lengths (the fingerprint "
        "refuses a stale one); ODB forms groups from realised lengths and needs none.",
        "Cache build s: every timed pass of the build (the first, a cold build, is the one "
        "charged). Epoch s: the timed epochs. Samples/s incl. cache: each measurement with "
        "build time / emitted samples added to every sample's time; Cache share %: that "
        "addition's share of a sample's time, per measurement. vs ODB: against ODB in the "
        "same cell, per pairing. " + CLAIM_RULE,
        scale_note(got.grid),
    ]
    write_table(
        args,
        NAME,
        pd.DataFrame([row for row, _ in made]),
        "Length-cache cost: GMT/BMT vs ODB",
        notes,
        got.missing,
        [d for _, d in made],
    )


if __name__ == "__main__":
    main()
