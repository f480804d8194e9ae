"""Padding efficiency, budget fill, steps per epoch and IDLE steps of ODB's grouping.

For each of the four length distributions (:mod:`bench.distributions`), each budget
and world size, and both alignment policies, one epoch is simulated with
:func:`odb.planning.simulate.simulate` (the collate side's own round driver,
:mod:`odb.core.lockstep`, on the real :class:`odb.core.rounds.RankRounds`) and compared with

* **Standard**: a fixed batch of ``budget // cutoff`` samples over the shuffled views
  (the largest batch that never exceeds the budget at the cutoff length);
* the **offline oracle**: a global sort of all samples, greedy token-budget groups,
  dealt to ``W`` ranks: ``steps = ceil(groups / W)``;
* the **per-rank oracle**: each rank's own view sorted and grouped offline; the epoch
  lasts as long as the heaviest rank (the best any method that does not move samples
  between ranks can do; equal to the oracle at ``W = 1``).

Targets (issue): padding efficiency >= 0.97 on all four; steps <= 1.03x the oracle's;
IDLE steps <= 1% of steps at ``W = 4``. The JSON reports pass/fail for each run.

Then the knobs, at one budget and ``W = 1`` and ``4``: ``buffer_budgets``,
``initial_buffer_budgets`` (the epoch-start ramp; ``64`` = no ramp), ``age_limit`` and
``queue_depth`` one at a time from the defaults, and a small grid over three of them
(``balanced``, both budgets, both world sizes) that lists which settings meet the
targets everywhere.

The byte cap (``buffer_bytes``) binds only when samples carry tensors; the simulated
lengths carry none, so ``byte_sweep`` gives every sample ``--bytes-per-token`` bytes per
token (default 24576: Qwen3-VL's float32 ``pixel_values`` of one merged visual token, 2x2
patches of 3*2*16*16 values; i.e. the worst case, every token an image token) and runs
the defaults under a few caps.

    python -m bench.grouping --out results/bench/grouping.json \
        --plot docs/figures/padding_vs_buffer.png
"""

from __future__ import annotations

from pathlib import Path

from bench import _io
from bench.distributions import CUTOFF, NAMES, lengths, summary
from bench.grouping_knobs import byte_sweep, knob_grid, sweeps
from bench.grouping_runs import (
    IDLE_TARGET,
    PAD_TARGET,
    POLICIES,
    STEPS_TARGET,
    per_rank_oracle,
    run_one,
)
from odb import ODBConfig
from odb.planning.simulate import (
    oracle,
    standard,
)


def main_grid(args) -> dict:
    """Distributions x budgets x world sizes x policies at the default knobs."""
    out = {}
    for name in NAMES:
        lens = lengths(name, args.n, args.seed)
        entry = {"lengths": summary(lens), "budgets": {}}
        for budget in args.budgets:
            by_w = {}
            for w in args.worlds:
                orc = oracle(lens, budget, w)
                rank_orc = per_rank_oracle(lens, budget, w, args.seed)
                row = {
                    "oracle": orc,
                    "per_rank_oracle": rank_orc,
                    "standard": standard(lens, budget, w, CUTOFF, args.seed),
                }
                for policy in POLICIES:
                    _io.progress(f"grid {name} budget={budget} W={w} {policy}")
                    cfg = ODBConfig(token_budget=budget, policy=policy, seed=args.seed)
                    row[policy] = run_one(lens, cfg, w, orc, rank_orc)
                by_w[f"W={w}"] = row
            entry["budgets"][str(budget)] = by_w
        out[name] = entry
    return out


def target_summary(grid: dict) -> dict:
    """Pass/fail of every target, per distribution, budget, world size and policy."""
    out = {}
    for name, entry in grid.items():
        for budget, by_w in entry["budgets"].items():
            for w, row in by_w.items():
                for policy in POLICIES:
                    s = row[policy]
                    out[f"{name}/{budget}/{w}/{policy}"] = s["pass"]
    failing = {k: [t for t, ok in v.items() if not ok] for k, v in out.items()}
    return {
        "per_run": out,
        "failing": {k: v for k, v in failing.items() if v},
        "all_pass": not any(failing.values()),
    }


def plot(sweep: dict, path: Path) -> None:
    """Padding efficiency vs buffer_budgets, one panel per swept world size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = list(sweep["worlds"])
    fig, axes = plt.subplots(
        1, len(worlds), figsize=(5.2 * len(worlds), 4.2), sharey=True, squeeze=False
    )
    colors = dict(zip(NAMES, ("C0", "C1", "C2", "C3"), strict=True))
    for ax, world in zip(axes[0], worlds, strict=True):
        entry = sweep["worlds"][world]
        rows = entry["knobs"]["buffer_budgets"]
        for name in NAMES:
            for policy, style in (("balanced", "-o"), ("paper", "--x")):
                pts = [
                    (r["buffer_budgets"], r["padding_efficiency"])
                    for r in rows
                    if r["dist"] == name and r["policy"] == policy
                ]
                ax.plot(
                    *zip(*pts, strict=True),
                    style,
                    color=colors[name],
                    label=f"{name} ({policy})",
                    alpha=0.9 if policy == "balanced" else 0.6,
                )
            ref = entry["oracle"][name]["per_rank_oracle"]["padding_efficiency"]
            ax.axhline(ref, color=colors[name], ls=":", lw=1)
        ax.axhline(PAD_TARGET, color="k", lw=1, label="target 0.97")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("buffer_budgets (buffer size in budgets' worth of tokens)")
        ax.set_title(
            f"budget {sweep['budget']}, {world}, {args_n(sweep)} samples "
            "(dotted: per-rank offline oracle)",
            fontsize=8,
        )
    axes[0][0].set_ylabel("padding efficiency (real / padded tokens)")
    axes[0][-1].legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _io.progress(f"wrote {path}")


def args_n(sweep: dict) -> int:
    return sweep.get("n", 0)


def _reported_defaults() -> dict:
    """The ODBConfig defaults that shape the grouping, as the JSON records them."""
    keys = (
        "buffer_budgets",
        "initial_buffer_budgets",
        "buffer_bytes",
        "buffer_size",
        "queue_depth",
        "age_limit",
        "join",
    )
    config = ODBConfig(token_budget=8192)
    return {k: getattr(config, k) for k in keys}


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budgets", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 4])
    p.add_argument("--sweep-budget", type=int, default=8192)
    p.add_argument("--sweep-worlds", type=int, nargs="+", default=[1, 4])
    p.add_argument("--grid-buffers", type=int, nargs="+", default=[64, 128])
    p.add_argument("--grid-ages", type=int, nargs="+", default=[2, 4, 16])
    p.add_argument("--grid-queues", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--no-grid", action="store_true", help="skip the knob grid")
    p.add_argument("--bytes-per-token", type=int, default=24576)
    p.add_argument(
        "--byte-caps",
        type=int,
        nargs="+",
        default=[256, 1024, 4096],
        help="buffer_bytes caps of the byte sweep, in MiB",
    )
    p.add_argument("--plot", type=Path, default=None, help="PNG of padding eff. vs buffer_budgets")
    args = p.parse_args()
    grid = main_grid(args)
    sweep = sweeps(args)
    sweep["n"] = args.n
    result = {
        "benchmark": "grouping",
        "machine": _io.machine(),
        "settings": {
            "n": args.n,
            "seed": args.seed,
            "cutoff": CUTOFF,
            "defaults": _reported_defaults(),
            "free_slots": "queue_depth (trainer keeps up)",
        },
        "targets": {
            "padding_efficiency": PAD_TARGET,
            "steps_vs_oracle": STEPS_TARGET,
            "idle_fraction_at_W4": IDLE_TARGET,
        },
        "results": grid,
        "target_summary": target_summary(grid),
        "sweeps": sweep,
        "byte_sweep": byte_sweep(args),
    }
    if not args.no_grid:
        result["knob_grid"] = knob_grid(args)
    if args.plot is not None:
        plot(sweep, args.plot)
    _io.emit(result, args.out)


if __name__ == "__main__":
    main()
