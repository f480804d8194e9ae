"""The grouping knobs: one at a time from the defaults, under byte caps, and a small grid.

``buffer_budgets``, ``initial_buffer_budgets``, ``age_limit`` and ``queue_depth`` are
swept one at a time at one budget; ``byte_sweep`` gives every token a byte size and runs
the defaults under a few ``buffer_bytes`` caps; ``knob_grid`` lists which settings meet
the targets in every case.
"""

from __future__ import annotations

import itertools

from bench import _io
from bench.distributions import NAMES, lengths
from bench.grouping_runs import PAD_TARGET, POLICIES, STEPS_TARGET, per_rank_oracle, run_one
from odb import ODBConfig
from odb.planning.simulate import (
    oracle,
    simulate,
)

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
