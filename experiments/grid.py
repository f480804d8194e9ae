"""The experiment grid of the workflow: which training cells exist, and how each is run.

The Snakefile and its rule files ask this module, never each other, what the grid is.
From the validated workflow config (``config/cpu.yaml`` or ``config/paper.yaml``) it
builds every *cell* (one training run: data variant x method x model x mode x nodes x
seed, plus the setting an ablation changes), the command-line overrides of
``python -m experiments.train`` for it, the evaluations of its checkpoint, and the
cells behind each paper table. Pure: no torch, no I/O except the manifest CLI.

Cell names are canonical, so an ablation cell that equals a main-grid cell *is* that
cell (run once, shared): ``<data>.<method>.<model>-<mode>-n<nodes>-s<seed>`` followed by
``.b<budget>`` when the budget differs from the dataset's, ``.e<epochs>`` when set, and
``.<option>-<value>`` for each ODB option set, e.g.
``ultrachat.odb.tiny-full-n1-s0.policy-paper``.

    python -m experiments.grid manifest --config-json "$(cat cfg.json)" --out grid.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from experiments.grid_cells import Grid
from experiments.grid_data import leverage_name, staged_model, variants

# The ODB settings of experiments/configs/method/odb.yaml: an ablation option equal to one of
# them names the main-grid cell itself (so it is not run twice).
ODB_LAYER = "experiments/configs/method/odb.yaml"
# The workflow config's former keys, per section: refused before the schema
# check, whose own message ("'engine' was unexpected") would not name the new key.
RENAMED_KEYS = {  # section -> {old: (new, why)}
    "train": {"engine": ("strategy", "the layer under experiments/configs/strategy/: how the "
                         "model trains across processes; 'engine' now means only DeepSpeed's "
                         "engine object")},
}


def _product(block: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for d, m, model, mode, nodes, seed in itertools.product(
        block["datasets"],
        block["methods"],
        block["models"],
        block["modes"],
        block["nodes"],
        block["seeds"],
    ):
        yield {"data": d, "method": m, "model": model, "mode": mode, "nodes": nodes, "seed": seed}


def refuse_renamed(config: Mapping[str, Any]) -> None:
    """Raise for a workflow-config key under its former name (``RENAMED_KEYS``).

    Example:
        >>> refuse_renamed({"train": {"engine": "ddp"}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: train.engine was renamed train.strategy (...); write strategy: ddp ...
    """
    # Imported here: the paper scripts read the grid and never import torch (``import odb`` does).
    from odb.kit import refuse_renamed as refuse

    for section, renamed in RENAMED_KEYS.items():
        fix = "write {new}: {value} under " + section + ": in the workflow config"
        refuse(config.get(section) or {}, renamed, fix, prefix=f"{section}.")


def build_grid(config: Mapping[str, Any]) -> Grid:
    """Every cell of ``config`` (the workflow config, already schema-validated).

    Example:
        >>> import yaml
        >>> grid = build_grid(yaml.safe_load(open("config/cpu.yaml")))  # doctest: +SKIP
        >>> "ultrachat.odb.tiny-full-n1-s0" in grid.cells                # doctest: +SKIP
        True
    """
    import yaml

    layer = yaml.safe_load((Path(__file__).resolve().parents[1] / ODB_LAYER).read_text())[
        "method"
    ].get("odb", {})
    # the workflow's own ODB settings name the main cells too (an ablation point equal to
    # them is the main cell, run once)
    layer = {**layer, **_odb_overrides(config["train"].get("method_overrides", {}).get("odb", []))}
    grid = Grid(config, variants=variants(config), odb_layer=layer)
    for model in config["train"]["models"].values():  # every staged checkpoint is staged
        if model.get("hub"):
            staged_model(config, model["hub"])
    ev = config["evaluate"]
    for block in config["grid"]:
        for spec in _product(block):
            name = grid.add("throughput", grid.cell(spec.pop("data"), spec.pop("method"), **spec))
            cell = grid.cells[name]
            grid.add("quality", cell)  # validation loss from the run; benchmarks if evaluated
            if cell.method in ev["methods"] and cell.mode in ev["modes"]:
                grid.evaluated.add(name)
            if cell.method in ("gmt", "bmt"):
                grid.add("cache", cell)
    for name in list(grid.tables.get("cache", [])):  # the ODB run beside each cache user
        c = grid.cells[name]
        grid.add(
            "cache",
            grid.cell(c.data, "odb", model=c.model, mode=c.mode, nodes=c.nodes, seed=c.seed),
        )
    _ablations(grid, config["ablations"])
    unknown = sorted(set(config["train"].get("cell_overrides", {})) - set(grid.cells))
    if unknown:
        raise ValueError(f"train.cell_overrides names cells the grid lacks: {unknown}; "
                         "cell names are in results/paper/grid.json (or the plan)")
    return grid


def _odb_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """The ``method.odb.<key>=<value>`` settings among a workflow's ODB overrides."""
    import yaml

    out = {}
    for text in overrides:
        key, _, raw = text.partition("=")
        if key.startswith("method.odb."):
            out[key.removeprefix("method.odb.")] = yaml.safe_load(raw)
    return out


def _ablations(grid: Grid, ab: Mapping[str, Any]) -> None:
    base = {k: ab["base"][k] for k in ("model", "mode", "nodes", "seed")}

    def add(table: str, data: str, method: str, **kw: Any) -> None:
        grid.add(table, grid.cell(data, method, **base, **kw))

    for data in ab["budget"]["datasets"]:
        add("budget", data, "standard")  # the speedup reference at the dataset's budget
        for budget in ab["budget"]["budgets"]:
            add("budget", data, "odb", budget=budget)
    for data in ab["depth"]["datasets"]:
        add("depth", data, "standard")
        add("depth", data, "odb")  # the main cell: the workflow's depth, else torch's (2)
        for d in ab["depth"]["prefetch_factors"]:
            add("depth", data, "odb", options={"prefetch_factor": d})
    lev = ab["leverage"]
    for cv, fs in itertools.product(lev["cvs"], lev["short_fractions"]):
        for method in lev["methods"]:
            add("leverage", leverage_name(cv, fs), method)
    for data in ab["policy"]["datasets"]:
        add("policy", data, "standard")
        for policy in ab["policy"]["policies"]:
            add("policy", data, "odb", options={"policy": policy})
    for data in ab["join"]["datasets"]:
        add("join", data, "standard")
        for join in ab["join"]["join"]:
            add("join", data, "odb", options={"join": join})
    st = ab["staleness"]
    for data in st["datasets"]:
        key = f"{data}-aug{st['aug'][0]}-{st['aug'][1]}"
        add("staleness", data, "standard")  # un-augmented reference for the speedups
        for method in st["methods"]:
            add("staleness", key, method, epochs=st["epochs"])


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    man = sub.add_parser("manifest", help="write the grid manifest the paper scripts read")
    man.add_argument("--config-json", required=True, help="the workflow config as JSON")
    man.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    grid = build_grid(json.loads(args.config_json))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(grid.manifest(), indent=1, sort_keys=True) + "\n")
    print(f"{len(grid.cells)} cells -> {args.out}")


if __name__ == "__main__":
    _main()
