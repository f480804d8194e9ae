"""Table: DGAP target policy — ``paper`` (max-based bidirectional) vs ``balanced``.

Same data, budget and seed; only ``method.odb.policy`` differs. IDLE steps, recirculated
samples and alignment round latency show what each policy costs; the throughput of each
policy is judged against the default one by the claim rule (``paper.common.verdict``).

    python -m paper.policy --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    CLAIM_RULE,
    Collected,
    Run,
    Spread,
    by_variant,
    collect,
    fixed,
    mean_std,
    parse_args,
    per_measurement,
    scale_note,
    sweep_row,
    write_table,
)

NAME = "policy"


def _policy(run) -> str:
    return run.result["config"]["method"].get("odb", {}).get("policy", "balanced")


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One policy (``runs``: its seeds): timings with their spread, the verdict against
    ODB's default policy, and what the policy costs in steps, IDLE and recirculation."""
    policy = _policy(runs[0])
    row, data = sweep_row(got, runs, "Policy", policy, "vs default policy")
    losses = [(r.result.get("validation") or {}).get("loss") for r in runs]
    row.update({
        "Steps": fixed([r.result["steps"] for r in runs]),
        "IDLE %": fixed([100 * r.result["idle_fraction"] for r in runs], 2),
        "Recirculated": fixed([r.loader("recirculated") for r in runs]),
        "Round ms": Spread.of(
            ms for r in runs for ms in per_measurement(r, "round_ms", r.loader("mean_round_ms"))
        ).format(1),
        "Val loss": mean_std([v for v in losses if v is not None], 3),
    })
    data["policy"] = policy
    return row, data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    odb = sorted(got.find(method="odb"), key=lambda r: (r["dataset"], _policy(r)))
    made = [_row(got, runs) for runs in by_variant(odb)]
    write_table(
        args,
        NAME,
        pd.DataFrame([row for row, _ in made]),
        "Target policy: paper vs balanced",
        [
            "vs default policy: ODB against ODB with the default policy, per pairing. "
            "Round ms: one figure per run. " + CLAIM_RULE,
            scale_note(got.grid),
        ],
        got.missing,
        [d for _, d in made],
    )


if __name__ == "__main__":
    main()
