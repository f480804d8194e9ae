"""The command ``python -m odb.planning``: :func:`odb.plan` for a dataset named on the shell.

    python -m odb.planning --dataset mypkg.data:train_set --world-sizes 1 8 \\
        --model qwen3-vl-8b --gpu h100 --json plan.json --plot plan.png

``--dataset module:name`` names the map-style dataset the loader will read (model-ready
samples): ``name`` is the dataset object itself (anything with ``__getitem__``), or a
function (or class) called with no arguments that returns it. Prints the table; writes
the JSON report and, with matplotlib installed, the plot. (The function is ``odb.plan``;
the command is ``odb.planning`` because a module named ``odb.plan`` would replace the
function on the ``odb`` package once imported.)
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from odb.planning.forecast import StepCost
from odb.planning.plan import DEFAULT_SHORT_THRESHOLD, DEFAULT_WORLD_SIZES, plan
from odb.planning.report import PlanReport
from odb.planning.report import plot as plot_report


def load_dataset(spec: str) -> Any:
    """``module:name`` -> the dataset, or an error that says what to change.

    ``name`` is the dataset when it has ``__getitem__`` (a dataset that is also callable
    is still the dataset); otherwise, when callable, it is called with no arguments and
    returns the dataset.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"--dataset {spec!r}: give module:name, e.g. mypkg.data:train_set")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"--dataset {spec!r}: cannot import {module_name!r}: {error}") from None
    if not hasattr(module, attr):
        raise SystemExit(f"--dataset {spec!r}: {module_name} has no {attr!r}")
    found = getattr(module, attr)
    if hasattr(found, "__getitem__") and not isinstance(found, type):
        return found
    if callable(found):
        return found()
    raise SystemExit(
        f"--dataset {spec!r}: {module_name}.{attr} (type {type(found).__name__}) is neither a "
        "map-style dataset (with __getitem__) nor a function that returns one; name one of those"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m odb.planning", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--dataset",
        required=True,
        metavar="MODULE:NAME",
        help="the map-style dataset, e.g. mypkg.data:train_set: a dataset object, or a "
        "function that returns one (called with no arguments)",
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=None)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=list(DEFAULT_WORLD_SIZES))
    parser.add_argument("--cutoff", type=int, default=None)
    parser.add_argument("--samples", type=int, default=2000, help="0 = every sample")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds of reading")
    parser.add_argument("--step-cost", type=float, nargs=2, default=None, metavar=("A", "B"))
    parser.add_argument("--short-threshold", type=int, default=DEFAULT_SHORT_THRESHOLD)
    parser.add_argument(
        "--model",
        default=None,
        help="qwen3-vl-2b, qwen3-vl-8b, llama-3.1-8b or an HF config.json path",
    )
    parser.add_argument("--gpu", default=None, help="a100, h100, h200 or h20 (with --model)")
    parser.add_argument("--strategy", default="ddp", help="ddp, zero2 or fsdp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="report to write")
    parser.add_argument("--plot", type=Path, default=None, help="PNG to write")
    return parser.parse_args(argv)


def run(dataset: Any, args: argparse.Namespace, **options: Any) -> PlanReport:
    """Plan ``dataset`` with the command line's settings; print, write JSON and plot."""
    report = plan(
        dataset,
        budgets=args.budgets,
        world_sizes=args.world_sizes,
        cutoff=args.cutoff,
        num_samples=args.samples or None,
        num_workers=args.workers,
        time_limit_s=args.time_limit,
        step_cost=None if args.step_cost is None else StepCost(*args.step_cost),
        short_threshold=args.short_threshold,
        model=args.model,
        gpu=args.gpu,
        strategy=args.strategy,
        seed=args.seed,
        **options,
    )
    print(report.table())
    if args.json is not None:
        report.write_json(args.json)
        print(f"wrote {args.json}")
    if args.plot is not None:
        _plot(report, args.plot)
    return report


def _plot(report: PlanReport, path: Path) -> None:
    try:
        plot_report(report, path)
    except ImportError:
        print(f"no plot: matplotlib is not installed (pip install matplotlib); {path} not written")
        return
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(load_dataset(args.dataset), args)
    return report.to_dict()
