"""Standard, Sorted, GMT, BMT, Packing and ODB on the four proxy datasets' real lengths.

For each proxy (written by :mod:`experiments.data.proxies`, run through the real
preprocessing pipeline with a locally trained tokenizer) this benchmark

1. builds the GMT/BMT **length cache** with one full pass of the pipeline
   (:func:`baselines.length_cache.build`, images decoded and processed) and times it,
   next to the pipeline's cheap ``length(i)`` pass (no pixels) for comparison;
2. plans one epoch of every baseline from the cached lengths with the loaders' own
   planners (:mod:`baselines.methods`; Sorted uses the cache too, its best case) and
   simulates ODB with :func:`odb.planning.simulate.simulate` (the real round protocol);
3. reports per method: steps per epoch, padding efficiency (real / occupied tokens),
   budget fill (mean cost / budget over real steps), IDLE steps, dropped samples
   (counted: samples that no step holds), and, for the baselines, the step imbalance
   across ranks (mean over steps of the largest rank cost over the mean rank cost) and
   the critical path (sum over steps of the
   largest rank cost, in M tokens: the padded-token work the slowest rank sets).

No augmentation, so realised lengths equal the cached ones and no budget is violated.
Packing is text-only: it is reported for UltraChat only.

    python -m bench.baselines --out results/bench/baselines.json \\
        --table results/bench/baselines.md
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from baselines.length_cache import build as build_cache
from baselines.methods import BMTPlan, GMTPlan, PackingPlan, SortedPlan, StandardPlan
from baselines.plans import Plan
from bench import _io
from odb import ODBConfig, TokenBudget
from odb.kit import GroupMeasure
from odb.planning.simulate import round_robin_views, simulate, summarize

METHODS = ("standard", "sorted", "gmt", "bmt", "packing", "odb")
TEXT_ONLY = ("ultrachat",)


def datasets(root: Path, n: int, seed: int, cutoff: int) -> dict:
    """The four proxies through the real pipeline (proxies and assets written under root)."""
    from experiments.data.assets import build_image_processor, corpus_from_proxies, train_tokenizer
    from experiments.data.pipeline import PreprocessedDataset
    from experiments.data.proxies import write_proxy
    from experiments.data.proxy_plans import PROXY_NAMES, ProxyConfig, default_max_pixels
    from experiments.data.records import DataConfig

    for name in PROXY_NAMES:
        if not (root / name).exists():
            _io.progress(f"writing proxy {name} ({n} samples)")
            write_proxy(ProxyConfig(name, num_samples=n, seed=seed), root / name)
    processor = root / "processor"
    if not processor.exists():
        _io.progress("training the tokenizer")
        train_tokenizer(corpus_from_proxies(root), processor)
        build_image_processor(768 * 768).save_pretrained(processor)
    out = {}
    for name in PROXY_NAMES:
        source = root / name / "llava_instruct_150k.json" if name == "llava" else root / name
        cfg = DataConfig(name, str(source), str(processor), cutoff_len=cutoff,
                         image_max_pixels=default_max_pixels(name))
        out[name] = PreprocessedDataset(cfg)
    return out


def measure(dataset, workers: int) -> tuple[np.ndarray, dict]:
    """Cached lengths and the cost of getting them (full pass vs length-only pass)."""
    started = time.perf_counter()
    cheap = dataset.lengths()
    cheap_s = time.perf_counter() - started
    cache = build_cache(dataset, num_workers=workers)
    with tempfile.TemporaryDirectory() as tmp:
        size = cache.save(Path(tmp) / "cache.json")
    lengths = np.asarray(cache.lengths)
    assert np.array_equal(lengths, cheap), "length(i) disagrees with the full pipeline"
    return lengths, {
        "samples": cache.num_samples,
        "build_s": cache.build_seconds,
        "build_ms_per_sample": round(1000 * cache.build_seconds / cache.num_samples, 3),
        "length_only_pass_s": round(cheap_s, 3),
        "workers": workers,
        "size_bytes": size,
        "total_patches": int(sum(cache.patches)),
    }


def plan_stats(plan: Plan, lengths: np.ndarray, budget: TokenBudget) -> dict:
    """Epoch metrics of a plan whose realised lengths are ``lengths``."""
    real = occupied = 0
    fills, ratios, critical = [], [], 0
    for step in zip(*plan, strict=True):
        costs = []
        for group in step:
            if not group:
                continue
            m = GroupMeasure()
            for i in group:
                m = m.plus(int(lengths[i]))
            cost = budget.cost(m)
            real += m.sum_len
            occupied += cost  # padded: n * max; packed: the row's length
            fills.append(cost / budget.max_tokens)
            costs.append(cost)
        critical += max(costs, default=0)
        if len(costs) > 1:
            ratios.append(max(costs) / (sum(costs) / len(costs)))
    return {
        "steps": len(plan[0]),
        "padding_efficiency": round(real / occupied, 4),
        "budget_fill": round(float(np.mean(fills)), 4),
        "idle_steps": sum(1 for steps in plan for s in steps if not s),
        "dropped": len(lengths) - len({i for steps in plan for s in steps for i in s}),
        "step_imbalance": round(float(np.mean(ratios)), 4) if ratios else 1.0,
        "critical_path_Mtokens": round(critical / 1e6, 3),
    }


def baseline(method: str, lengths: np.ndarray, budget: int, world: int, cutoff: int,
             seed: int) -> dict:
    pool = round_robin_views(len(lengths), 1, seed)[0]  # the epoch's seeded global order
    lens = [int(x) for x in lengths]
    padded, packed = TokenBudget(budget), TokenBudget(budget, "packed")
    batch = budget // cutoff
    planner = {
        "standard": StandardPlan(batch),
        "sorted": SortedPlan(batch, lens),
        "gmt": GMTPlan(padded, lens),
        "bmt": BMTPlan(padded, lens),
        "packing": PackingPlan(packed, lens),
    }[method]
    started = time.perf_counter()
    plan = planner(pool, world, seed)
    row = plan_stats(plan, lengths, packed if method == "packing" else padded)
    row["plan_s"] = round(time.perf_counter() - started, 3)
    if method in ("standard", "sorted"):
        row["batch_size"] = batch
    return row


def odb_row(lengths: np.ndarray, budget: int, world: int, seed: int) -> dict:
    result = simulate(lengths, ODBConfig(token_budget=budget, seed=seed), world_size=world)
    emitted = {i for rank in result.ranks for step in rank.ids for i in step}
    s = summarize(result)
    return {
        "steps": s["steps"],
        "padding_efficiency": s["padding_efficiency"],
        "budget_fill": s["mean_fill"],
        "idle_steps": s["idle_steps"],
        "dropped": len(lengths) - len(emitted),
        "step_imbalance": None,  # the simulator does not keep per-step rank pairing
        "critical_path_Mtokens": None,
    }


def table(result: dict, budget: int, world: int) -> str:
    """One Markdown table: every dataset and method at one budget and world size."""
    lines = [
        f"Budget {budget} tokens, W={world}, cutoff {result['config']['cutoff']}, "
        f"{result['config']['n']} samples per proxy, seed {result['config']['seed']}.",
        "",
        "| dataset | method | steps | pad. eff. | budget fill | IDLE | dropped | imbalance "
        "| critical path (M tok) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in result["datasets"].items():
        for method, row in entry["budgets"][str(budget)][f"W={world}"].items():
            if row is None:
                lines.append(f"| {name} | {method} | n/a (text-only) | | | | | | |")
                continue
            cells = [row["steps"], row["padding_efficiency"], row["budget_fill"],
                     row["idle_steps"], row["dropped"], row["step_imbalance"],
                     row["critical_path_Mtokens"]]
            text = " | ".join("-" if c is None else str(c) for c in cells)
            lines.append(f"| {name} | {method} | {text} |")
    return "\n".join(lines) + "\n"


def cache_table(result: dict) -> str:
    """What the length cache cost: the full pass against the pipeline's length-only pass."""
    lines = ["| dataset | cache build (full pass) | ms/sample | length-only pass | size |",
             "|---|---:|---:|---:|---:|"]
    for name, entry in result["datasets"].items():
        c = entry["cache"]
        lines.append(f"| {name} | {c['build_s']} s ({c['workers']} workers) | "
                     f"{c['build_ms_per_sample']} | {c['length_only_pass_s']} s | "
                     f"{c['size_bytes'] / 1024:.1f} KiB |")
    return "\n".join(lines) + "\n"


def tables(result: dict) -> str:
    """Every Markdown table of a result: one per (budget, world size), then the cache's."""
    cfg = result["config"]
    parts = [table(result, b, w) for b in cfg["budgets"] for w in cfg["worlds"]]
    return "\n".join([*parts, cache_table(result)])


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None,
                   help="folder for proxies and assets (default: a temporary one)")
    p.add_argument("--n", type=int, default=1000, help="samples per proxy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cutoff", type=int, default=16384, help="the pipeline's cutoff_len")
    p.add_argument("--budgets", type=int, nargs="+", default=[16384, 32768])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--workers", type=int, default=2, help="workers of the cache build")
    p.add_argument("--table", type=Path, default=None, help="write Markdown tables here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or Path(tmp)
        out = {"benchmark": "baselines", "machine": _io.machine(),
               "config": {k: v for k, v in vars(args).items() if k in
                          ("n", "seed", "cutoff", "budgets", "worlds", "workers")},
               "datasets": {}}
        for name, dataset in datasets(root, args.n, args.seed, args.cutoff).items():
            _io.progress(f"length cache {name}")
            lengths, cache = measure(dataset, args.workers)
            entry = {"cache": cache, "lengths": {
                "mean": round(float(lengths.mean()), 1), "max": int(lengths.max()),
                "cv": round(float(lengths.std() / lengths.mean()), 3)}, "budgets": {}}
            for budget in args.budgets:
                by_world = {}
                for world in args.worlds:
                    _io.progress(f"{name} budget={budget} W={world}")
                    row = {}
                    for method in METHODS:
                        if method == "packing" and name not in TEXT_ONLY:
                            row[method] = None
                        elif method == "odb":
                            row[method] = odb_row(lengths, budget, world, args.seed)
                        else:
                            row[method] = baseline(method, lengths, budget, world,
                                                   args.cutoff, args.seed)
                    by_world[f"W={world}"] = row
                entry["budgets"][str(budget)] = by_world
            out["datasets"][name] = entry
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(tables(out))
    _io.emit(out, args.out)


if __name__ == "__main__":
    main()
