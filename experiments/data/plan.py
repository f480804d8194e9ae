"""Before training one of the artifact's datasets: :func:`odb.plan` through the real
Qwen3-VL pipeline, with the data settings the workflow's training cells use.

    python -m experiments.data.plan --data sharegpt4o                  # CPU scale: proxies
    python -m experiments.data.plan --data llava --configfile config/paper.yaml

The dataset is the one a cell of the workflow config reads (``experiments.grid``:
source, processor, cutoff, image pixels), whole (not the cell's ``max_samples``), each
sample through ``PreprocessedDataset.__getitem__`` (template, tokenizer, image
processor, visual tokens), planned with the cells' ODB settings (``grid.odb_layer``).
At CPU scale the proxies and the local processor are the
workflow's (``results/data/proxies``, ``results/data/assets``), made here when missing
as their rules make them. Candidate budgets: the config's budget for the dataset,
halved and doubled. Prints the table; writes ``results/plan/<data>.json`` and ``.png``.

(``experiments.plan`` is the grid's plan of runs and GPU-hours; this one plans a dataset.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from experiments.data import assets, proxies
from experiments.data.pipeline import PreprocessedDataset
from experiments.data.proxy_lengths import SHORT_THRESHOLD
from experiments.data.records import DataConfig
from experiments.grid import build_grid
from experiments.grid_cells import Grid
from experiments.workflow_config import load_files
from odb.planning.cli import run

PROXIES = Path("results/data/proxies")
ASSETS = Path("results/data/assets")


def dataset_of(grid: Grid, data: str) -> PreprocessedDataset:
    """The variant's dataset as its training cells build it, every record of it."""
    args: dict[str, Any] = grid.data_args(data)
    args.update(max_samples=0, holdout_samples=0)
    return PreprocessedDataset(DataConfig(**args))


def ensure_proxy_inputs(config: dict[str, Any]) -> None:
    """At CPU scale, the proxies and the local processor as the workflow's rules make
    them, when they are missing (no-op at paper scale: the site cache is staged)."""
    if config["data"]["source"] != "proxies":
        return
    seed = str(config["seed"])
    if not PROXIES.exists():
        samples = str(config["data"].get("proxy_samples") or 0)
        proxies.main(["--out", str(PROXIES), "--num-samples", samples, "--seed", seed])
    if not ASSETS.exists():
        assets.main(["--proxies", str(PROXIES), "--out", str(ASSETS), "--seed", seed])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """This command's arguments; :func:`main` completes them as ``odb.planning``'s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a data variant of the config")
    parser.add_argument("--configfile", type=Path, nargs="*", default=[],
                        help="workflow config files, as snakemake --configfile")  # fmt: skip
    parser.add_argument("--budgets", type=int, nargs="+", default=None)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--samples", type=int, default=2000, help="0 = every sample")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--step-cost", type=float, nargs=2, default=None, metavar=("A", "B"))
    parser.add_argument("--model", default=None, help="the step-cost model's: 2b, 8b or a path")
    parser.add_argument("--gpu", default=None, help="a100, h100, h200 or h20 (with --model)")
    parser.add_argument("--strategy", default="ddp", help="ddp, zero2 or fsdp")
    parser.add_argument("--out-dir", type=Path, default=Path("results/plan"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = load_files(*args.configfile)
    grid = build_grid(config)
    if args.data not in grid.variants:
        raise SystemExit(f"--data {args.data!r}: the config's data variants are "
                         f"{sorted(grid.variants)}")  # fmt: skip
    ensure_proxy_inputs(config)
    dataset = dataset_of(grid, args.data)
    budget = grid.default_budget(args.data)
    args.budgets = args.budgets or [budget // 2, budget, 2 * budget, 4 * budget]
    args.cutoff = grid.data_args(args.data)["cutoff_len"]
    args.short_threshold, args.seed = SHORT_THRESHOLD, int(config["seed"])
    args.json = args.out_dir / f"{args.data}.json"
    args.plot = args.out_dir / f"{args.data}.png"
    return run(dataset, args, **grid.odb_layer).to_dict()


if __name__ == "__main__":
    main()
