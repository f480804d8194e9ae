"""Table: DGAP target policy — ``paper`` (max-based bidirectional) vs ``balanced``.

Same data, budget and seed; only ``method.odb.policy`` differs. IDLE steps, recirculated
samples and alignment round latency show what each policy costs; the throughput of each
policy is judged against the default one by the claim rule (``paper.claims.verdict``).

    python -m paper.policy --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

from paper.cells import fixed, sweep_row
from paper.claims import CLAIM_RULE, Spread, per_measurement
from paper.common import Collected, Run, mean_std
from paper.sweep import Sweep, run_sweep

NAME = "policy"


def _policy(run) -> str:
    return run.result["config"]["method"].get("odb", {}).get("policy", "balanced")


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One policy (``runs``: its seeds): timings with their spread, the verdict against
    ODB's default policy, and what the policy costs in steps, IDLE and recirculation."""
    policy = _policy(runs[0])
    row, data = sweep_row(got, runs, "Policy", policy, "vs default policy")
    losses = [(r.result.get("validation") or {}).get("loss") for r in runs]
    row.update(
        {
            "Steps": fixed([r.result["steps"] for r in runs]),
            "IDLE %": fixed([100 * r.result["idle_fraction"] for r in runs], 2),
            "Recirculated": fixed([r.loader("recirculated") for r in runs]),
            "Round ms": Spread.of(
                ms for r in runs for ms in per_measurement(r, "round_ms", r.loader("mean_round_ms"))
            ).format(1),
            "Val loss": mean_std([v for v in losses if v is not None], 3),
        }
    )
    data["policy"] = policy
    return row, data


SWEEP = Sweep(
    name=NAME,
    title="Target policy: paper vs balanced",
    note="vs default policy: ODB against ODB with the default policy, per pairing. "
    "Round ms: one figure per run. " + CLAIM_RULE,
    row=_row,
    order=lambda r: (r["dataset"], _policy(r)),
)


def main(argv: list[str] | None = None) -> None:
    run_sweep(SWEEP, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
