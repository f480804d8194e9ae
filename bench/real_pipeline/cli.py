"""The command line: flags, the cells each (proxy, W) runs, the JSON document."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench import _io
from bench.real_pipeline.cell import run_cell
from bench.real_pipeline.rank import LOADERS, VARIANTS, CellSpec, proxy_source
from bench.real_pipeline.report import compare, median_run, table
from experiments.data.proxy_plans import PROXY_NAMES, default_max_pixels

DESCRIPTION = (
    "odb vs a plain DataLoader on the real Qwen3-VL preprocessing path (the four proxies)."
)


def _check_args(args: Any, parser: Any) -> None:
    for name in args.proxies:
        if name not in PROXY_NAMES:
            parser.error(f"unknown proxy {name!r}; choose from {PROXY_NAMES}")
    for world in args.world:
        if world < 1:
            parser.error(f"--world {world}: every world size must be >= 1")
        if args.samples % world:
            # DistributedSampler would repeat samples to even the ranks out.
            parser.error(
                f"--samples {args.samples} is not divisible by W={world}; the plain "
                "DataLoader's DistributedSampler would repeat samples. Use a multiple of "
                f"{math.lcm(*args.world)}"
            )
    for name in ("samples", "budget", "epochs", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    if args.mem_interval_ms <= 0 or args.smaps_interval_ms < 0:
        parser.error(
            "--mem-interval-ms must be > 0 and --smaps-interval-ms >= 0 (0: no USS/PSS), "
            f"got {args.mem_interval_ms} and {args.smaps_interval_ms}"
        )
    if not args.processor.exists():
        parser.error(
            f"--processor {args.processor} does not exist; build the data assets "
            "(`make reproduce`, or experiments.data.assets) or point --processor at them"
        )


def _odb_options(pairs: list[str], workers: int, parser: Any) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` pairs as ODBConfig options, checked against its fields now (with
    ``--workers`` as ``num_workers``, which --odb may not set)."""
    import yaml

    import odb

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            parser.error(f"--odb takes KEY=VALUE pairs, got {pair!r}")
        options[key] = yaml.safe_load(value)
    if "num_workers" in options:
        parser.error("--odb: set num_workers with --workers (both loaders use it)")
    try:
        odb.ODBConfig.from_options(8192, None, {**options, "num_workers": workers})
    except (TypeError, ValueError) as exc:
        parser.error(f"--odb: {exc}")
    return tuple(options.items())


def _add_workload_args(p: Any) -> None:
    """What the cells run: the data, the loaders, the world sizes and the repeats."""
    p.add_argument("--samples", type=int, default=300, help="samples per epoch (all ranks)")
    p.add_argument("--budget", type=int, default=8192, help="odb token budget")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (both)")
    p.add_argument("--proxies", nargs="+", default=list(PROXY_NAMES))
    p.add_argument(
        "--loaders",
        nargs="+",
        default=list(LOADERS),
        choices=LOADERS,
        help="which loaders to run (plain always runs: the others are compared with it)",
    )
    p.add_argument("--world", type=int, nargs="+", default=[1, 2])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every loader per cell, alternating; the table gives the median run "
        "and each repeat's paired ratio",
    )
    p.add_argument(
        "--pixels",
        choices=["uint8", "float32"],
        default="uint8",
        help="how samples carry pixel_values (DataConfig.pixels; uint8 is the default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxies-dir", type=Path, default=Path("results/data/proxies"))
    p.add_argument("--processor", type=Path, default=Path("results/data/assets/processor"))
    p.add_argument(
        "--max-pixels",
        type=int,
        default=0,
        help="pixel budget for every proxy; 0: each proxy's own (default_max_pixels)",
    )
    p.add_argument("--cutoff-len", type=int, default=16384)


def _add_measurement_args(p: Any) -> None:
    """How a cell is sampled, reported and bounded in time."""
    p.add_argument(
        "--mem-interval-ms",
        type=float,
        default=50.0,
        help="sampling interval of anon + shm (/proc/meminfo; costs nothing)",
    )
    p.add_argument(
        "--smaps-interval-ms",
        type=float,
        default=0.0,
        help="sampling interval of USS / PSS (walks every page table, so it slows the "
        "loaders measured); 0 (default): do not sample them",
    )
    p.add_argument("--progress-s", type=float, default=10.0, help="rank progress interval")
    p.add_argument("--timeout", type=float, default=1800.0, help="hard limit per cell, s")


def _add_odb_and_consumer_args(p: Any) -> None:
    """odb's own options and the consumer's simulated work per token."""
    p.add_argument(
        "--odb",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="ODBConfig options for odb (values read as YAML), e.g. collate_mode=thread",
    )
    p.add_argument(
        "--consumer-us-per-token",
        type=float,
        default=0.0,
        help="the consumer busies the GIL this long per real token of each batch "
        "(pure Python; 0: a consumer that does nothing)",
    )


def _cell_spec(args: Any, proxy: str, loader: str, max_pixels: int, odb_options) -> CellSpec:
    """What every rank of one run of ``loader`` on ``proxy`` runs, from the flags."""
    return CellSpec(
        proxy=proxy,
        source=proxy_source(args.proxies_dir, proxy),
        processor=str(args.processor),
        loader=loader,
        samples=args.samples,
        budget=args.budget,
        workers=args.workers,
        epochs=args.epochs,
        max_pixels=max_pixels,
        cutoff_len=args.cutoff_len,
        seed=args.seed,
        progress_s=args.progress_s,
        odb_options=odb_options,
        consumer_us_per_token=args.consumer_us_per_token,
        pixels=args.pixels,
    )


def _run_logged(args: Any, spec: CellSpec, world: int, label: str) -> dict[str, Any]:
    """`run_cell` with the flags' intervals and limit, its start and summary on stderr."""
    _io.progress(f"{label}: starting {world} rank(s)")
    r = run_cell(
        spec, world, args.mem_interval_ms / 1000, args.timeout, args.smaps_interval_ms / 1000
    )
    _io.progress(
        f"{label}: {r['samples']} samples in {r['wall_s']:.1f} s, "
        f"{r['samples_per_s']} samples/s, first batch {r['first_batch_s']:.2f} s, "
        f"peak {r['peak_anon_shm_mb']:.0f} MB (anon + shm), "
        f"padding {r['padding_efficiency']}, "
        f"{r['steps']} steps"
    )
    return r


def _proxy_world(args: Any, proxy: str, world: int, max_pixels: int, odb_options) -> dict:
    """One (proxy, W): every loader ``--repeat`` times, alternating; each loader's median
    run (and every run, with repeats) and each odb variant against plain."""
    runs: dict[str, list[dict[str, Any]]] = {}
    # Repeats alternate the loaders (plain, odb, ..., plain, odb, ...), so a slow
    # spell of the machine lands on both; each ratio pairs one repeat's runs.
    for rep in range(args.repeat):
        for name in ["plain", *(n for n in args.loaders if n != "plain")]:
            label = f"{proxy} W={world} {name}" + (
                f" (repeat {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
            )
            spec = _cell_spec(args, proxy, name, max_pixels, odb_options)
            runs.setdefault(name, []).append(_run_logged(args, spec, world, label))
    cell: dict[str, Any] = {"proxy": proxy, "world_size": world}
    for name, rs in runs.items():
        cell[name] = median_run(rs)
        if args.repeat > 1:
            cell[f"{name}_runs"] = rs
    for variant in VARIANTS:
        if variant in cell:
            cell[f"{variant}_vs_plain"] = compare(cell["plain"], cell[variant])
            cell[f"{variant}_vs_plain"]["samples_per_s_ratio_per_repeat"] = [
                compare(p, o)["samples_per_s_odb_vs_plain"]
                for p, o in zip(runs["plain"], runs[variant], strict=True)
            ]
    return cell


def _document(args: Any, odb_options, proxies: dict, text: str, results: dict) -> dict:
    """The benchmark's JSON document: the machine, every setting, the table, the cells."""
    return {
        "benchmark": "real_pipeline",
        "machine": _io.machine(),
        "settings": {
            "samples_per_epoch": args.samples,
            "epochs": args.epochs,
            "token_budget": args.budget,
            "num_workers": args.workers,
            "world_sizes": args.world,
            "seed": args.seed,
            "cutoff_len": args.cutoff_len,
            "pixels": args.pixels,
            "repeat": args.repeat,
            "processor": str(args.processor),
            "proxies": proxies,
            "odb": {
                "options": dict(odb_options),
                "variants": VARIANTS,
                "otherwise": "ODBLoader defaults",
            },
            "plain": "DataLoader(batch_size=1, DistributedSampler(shuffle=True))",
            "collate": "experiments.data.pipeline.collate (pad id of the tokenizer)",
            "consumer": "counts samples and tokens; busy pure-Python "
            f"{args.consumer_us_per_token} us per real token",
            "ranks": "spawned, Gloo over TCP on 127.0.0.1 (harness.ranks.run_ranks)",
        },
        "table_markdown": text,
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = _io.parser(DESCRIPTION)
    _add_workload_args(p)
    _add_measurement_args(p)
    _add_odb_and_consumer_args(p)
    args = p.parse_args(argv)
    odb_options = _odb_options(args.odb, args.workers, p)
    _check_args(args, p)

    results: dict[str, Any] = {}
    proxies: dict[str, Any] = {}
    for proxy in args.proxies:
        max_pixels = args.max_pixels or default_max_pixels(proxy)
        proxies[proxy] = {
            "image_max_pixels": max_pixels,
            "source": proxy_source(args.proxies_dir, proxy),
        }
        for world in args.world:
            cell = _proxy_world(args, proxy, world, max_pixels, odb_options)
            results[f"{proxy}/W{world}"] = cell
    text = table(results)
    _io.progress("summary:\n" + text)
    doc = _document(args, odb_options, proxies, text, results)
    _io.emit(doc, args.out)
    return doc
