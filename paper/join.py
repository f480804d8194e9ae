"""Table: termination mode — join (identity coverage) vs non-join (quota closure).

With ``join=True`` a rank that has read its view keeps aligning (IDLE steps) until all
are done: every sample is emitted once per epoch. With ``join=False`` the epoch ends
when the first rank runs out and the buffered rest is carried into the next epoch. The
throughput of non-join is judged against join by the claim rule (``paper.claims.verdict``).

    python -m paper.join --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

from paper.cells import fixed, sweep_row
from paper.claims import CLAIM_RULE
from paper.common import Collected, Run
from paper.sweep import Sweep, run_sweep

NAME = "join"


def _join(run) -> bool:
    return bool(run.result["config"]["method"].get("odb", {}).get("join", True))


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One termination mode (``runs``: its seeds): timings with their spread, the verdict
    against ODB's default mode, and what each mode emits and carries."""
    join = _join(runs[0])
    row, data = sweep_row(got, runs, "Join", "yes" if join else "no", "vs default (join)")
    row.update(
        {
            "Emitted samples": fixed([r.result["emitted_samples"] for r in runs]),
            "Carried": fixed([r.loader("carried") for r in runs]),
            "Steps": fixed([r.result["steps"] for r in runs]),
            "IDLE %": fixed([100 * r.result["idle_fraction"] for r in runs], 2),
        }
    )
    data.update(join=join, emitted=runs[0].result["emitted_samples"])
    return row, data


SWEEP = Sweep(
    name=NAME,
    title="Termination: join vs non-join",
    note="Carried: samples buffered at the epoch's end, emitted in the next epoch "
    "(non-join). vs default (join): ODB against ODB with join, per pairing. " + CLAIM_RULE,
    row=_row,
    order=lambda r: (r["dataset"], not _join(r)),
)


def main(argv: list[str] | None = None) -> None:
    run_sweep(SWEEP, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
