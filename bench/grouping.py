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

import itertools
from pathlib import Path

from bench import _io
from bench.distributions import CUTOFF, NAMES, lengths, summary
from odb import ODBConfig, TokenBudget
from odb.kit import SizedSample, form_groups
from odb.planning.simulate import (
    group_stats,
    oracle,
    round_robin_views,
    simulate,
    standard,
    summarize,
)

PAD_TARGET = 0.97
STEPS_TARGET = 1.03
IDLE_TARGET = 0.01
POLICIES = ("balanced", "paper")


def per_rank_oracle(lens, budget: int, world_size: int, seed: int) -> dict:
    """Every rank groups its own view offline (sort + greedy within the view).

    ``steps`` is the heaviest rank's group count: no method that keeps each sample on
    the rank whose view holds it can do better; ``padding_efficiency`` is over all ranks.
    """
    groups, steps = [], 0
    for v in round_robin_views(len(lens), world_size, seed):
        mine = [
            [it.length for it in g.items]
            for g in form_groups([SizedSample(i, int(lens[i])) for i in v], TokenBudget(budget))
        ]
        groups += mine
        steps = max(steps, len(mine))
    return {
        "steps": steps,
        "padding_efficiency": round(group_stats(groups, budget)["padding_efficiency"], 4),
    }


def run_one(
    lens, config: ODBConfig, world_size: int, orc: dict, rank_orc: dict, result=None
) -> dict:
    """One simulated epoch (``result``, if already run) against the oracles and targets."""
    s = summarize(result or simulate(lens, config, world_size=world_size))
    per_rank = s.pop("per_rank")
    s["per_rank_steps_idle"] = [(r["real_steps"], r["idle"]) for r in per_rank]
    s["steps_vs_oracle"] = round(s["steps"] / orc["steps"], 4)
    s["steps_vs_per_rank_oracle"] = round(s["steps"] / rank_orc["steps"], 4)
    s["pass"] = {
        "padding_efficiency>=0.97": s["padding_efficiency"] >= PAD_TARGET,
        "steps<=1.03x_oracle": s["steps_vs_oracle"] <= STEPS_TARGET,
    }
    if world_size > 1:
        s["pass"]["idle<=1%"] = s["idle_fraction"] <= IDLE_TARGET
    s["pass_all"] = all(s["pass"].values())
    # Diagnostic (not the targets): the same targets against what a method that
    # never moves samples between ranks can reach at all (the per-rank oracle).
    s["pass_vs_per_rank_oracle"] = all(
        [
            s["padding_efficiency"] >= min(PAD_TARGET, rank_orc["padding_efficiency"] - 0.01),
            s["steps_vs_per_rank_oracle"] <= STEPS_TARGET,
            world_size == 1 or s["idle_fraction"] <= IDLE_TARGET,
        ]
    )
    return s


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


SWEEPS = {
    "buffer_budgets": (8, 16, 32, 64, 128),
    "initial_buffer_budgets": (1, 2, 4, 8, 64),
    "age_limit": (4, 16, 64),
    "queue_depth": (1, 4, 8, 16),
}


def sweeps(args) -> dict:
    """One knob at a time from the defaults, at ``--sweep-budget``, per ``--sweep-worlds``."""
    budget = args.sweep_budget
    out: dict = {
        "budget": budget,
        "defaults": {k: getattr(ODBConfig(token_budget=budget), k) for k in SWEEPS},
        "worlds": {},
    }
    data = {name: lengths(name, args.n, args.seed) for name in NAMES}
    for w in args.sweep_worlds:
        refs = {
            name: (oracle(data[name], budget, w), per_rank_oracle(data[name], budget, w, args.seed))
            for name in NAMES
        }
        knobs = {}
        for knob, values in SWEEPS.items():
            rows = []
            for value, name, policy in itertools.product(values, NAMES, POLICIES):
                _io.progress(f"sweep W={w} {knob}={value} {name} {policy}")
                cfg = ODBConfig(token_budget=budget, policy=policy, seed=args.seed, **{knob: value})
                s = run_one(data[name], cfg, w, *refs[name])
                rows.append(
                    {
                        knob: value,
                        "dist": name,
                        "policy": policy,
                        **{
                            k: s[k]
                            for k in (
                                "padding_efficiency",
                                "mean_fill",
                                "steps",
                                "steps_vs_oracle",
                                "steps_vs_per_rank_oracle",
                                "idle_steps",
                                "idle_fraction",
                                "max_age",
                                "rounds",
                                "pass_all",
                                "pass_vs_per_rank_oracle",
                            )
                        },
                    }
                )
            knobs[knob] = rows
        out["worlds"][f"W={w}"] = {
            "knobs": knobs,
            "oracle": {
                name: {
                    "steps": refs[name][0]["steps"],
                    "padding_efficiency": refs[name][0]["padding_efficiency"],
                    "per_rank_oracle": refs[name][1],
                }
                for name in NAMES
            },
        }
    return out


def byte_sweep(args) -> dict:
    """The defaults under a byte cap, every token ``--bytes-per-token`` bytes (worst case).

    ``buffer_budgets_equivalent`` is the cap in budgets of such tokens: below
    ``buffer_budgets`` (64) the cap, not the token target, sizes the buffer.
    """
    budget, per_token = args.sweep_budget, args.bytes_per_token
    data = {name: lengths(name, args.n, args.seed) for name in NAMES}
    rows = []
    for w, mib, name in itertools.product(args.sweep_worlds, args.byte_caps, NAMES):
        _io.progress(f"byte sweep W={w} buffer_bytes={mib} MiB {name}")
        lens = data[name]
        refs = (oracle(lens, budget, w), per_rank_oracle(lens, budget, w, args.seed))
        cfg = ODBConfig(token_budget=budget, seed=args.seed, buffer_bytes=mib * 2**20)
        sim = simulate(lens, cfg, world_size=w, sample_bytes=[int(n) * per_token for n in lens])
        s = run_one(lens, cfg, w, *refs, result=sim)
        rows.append(
            {
                "world_size": w,
                "buffer_bytes_mib": mib,
                "buffer_budgets_equivalent": round(mib * 2**20 / per_token / budget, 2),
                "dist": name,
                **{
                    k: s[k]
                    for k in ("padding_efficiency", "steps", "steps_vs_oracle", "idle_fraction")
                },
                "peak_buffer_mib": round(max(t.peak_buffer_bytes for t in sim.ranks) / 2**20, 1),
            }
        )
    return {"budget": budget, "bytes_per_token": per_token, "policy": "balanced", "rows": rows}


_GRID_CASE_KEYS = (
    "padding_efficiency",
    "steps_vs_oracle",
    "steps_vs_per_rank_oracle",
    "idle_fraction",
    "pass_vs_per_rank_oracle",
)


def knob_grid(args) -> dict:
    """Which (buffer_budgets, age_limit, queue_depth) meet each target everywhere?

    ``balanced`` only (the policies differ only in the tail), every distribution, every
    budget of ``--budgets`` and every world size of ``--worlds``. For each setting and
    each target: does it hold in every case? Also the worst value of each metric.
    """
    data = {name: lengths(name, args.n, args.seed) for name in NAMES}
    refs = {
        (name, b, w): (oracle(data[name], b, w), per_rank_oracle(data[name], b, w, args.seed))
        for name in NAMES
        for b in args.budgets
        for w in args.worlds
    }
    rows = []
    for wb, age, qd in itertools.product(args.grid_buffers, args.grid_ages, args.grid_queues):
        _io.progress(f"knob grid buffer={wb} age={age} queue={qd}")
        knobs = {"buffer_budgets": wb, "age_limit": age, "queue_depth": qd}
        rows.append(_grid_row(knobs, _grid_cases(knobs, data, refs, args.seed)))
    keys = ("buffer_budgets", "age_limit", "queue_depth")
    return {
        "policy": "balanced",
        "budgets": args.budgets,
        "worlds": args.worlds,
        "rows": rows,
        "passing_W1": [{k: r[k] for k in keys} for r in rows if r["all_pass_W1"]],
        "passing_vs_per_rank_oracle": [
            {k: r[k] for k in keys} for r in rows if r["all_pass_vs_per_rank_oracle"]
        ],
    }


def _grid_cases(knobs: dict, data: dict, refs: dict, seed: int) -> list[dict]:
    """One knob setting (``balanced``) simulated in every (distribution, budget, world
    size) case of ``refs`` (the case's oracles), in that order; the metrics the grid
    keeps of each."""
    cases = []
    for name, b, w in refs:
        cfg = ODBConfig(token_budget=b, policy="balanced", seed=seed, **knobs)
        s = run_one(data[name], cfg, w, *refs[(name, b, w)])
        cases.append(
            {"dist": name, "budget": b, "world_size": w, **{k: s[k] for k in _GRID_CASE_KEYS}}
        )
    return cases


def _grid_row(knobs: dict, cases: list[dict]) -> dict:
    """A knob setting's row: the worst value of each metric at ``W = 1`` and at the
    larger world sizes (reported as ``W4``), and whether every case meets the targets."""
    w1 = [c for c in cases if c["world_size"] == 1]
    wn = [c for c in cases if c["world_size"] > 1]
    return {
        **knobs,
        "min_padding_efficiency_W1": min(c["padding_efficiency"] for c in w1),
        "min_padding_efficiency_W4": min(c["padding_efficiency"] for c in wn),
        "max_steps_vs_oracle_W1": max(c["steps_vs_oracle"] for c in w1),
        "max_steps_vs_oracle_W4": max(c["steps_vs_oracle"] for c in wn),
        "max_steps_vs_per_rank_oracle_W4": max(c["steps_vs_per_rank_oracle"] for c in wn),
        "max_idle_fraction_W4": max(c["idle_fraction"] for c in wn),
        "all_pass_W1": all(
            c["padding_efficiency"] >= PAD_TARGET and c["steps_vs_oracle"] <= STEPS_TARGET
            for c in w1
        ),
        "all_pass_vs_per_rank_oracle": all(c["pass_vs_per_rank_oracle"] for c in cases),
        "cases": cases,
    }


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
