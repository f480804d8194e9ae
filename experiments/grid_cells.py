"""The grid's cells and what each needs: its name, train invocation, evaluations, order.

`experiments.grid.build_grid` fills a :class:`Grid` from the workflow config; the
Snakefile's rules then ask it for each cell's command line, launcher, priority and
result files, and the paper scripts read its manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from experiments.grid_data import DataVariant, processor, staged_model

TEXT_DATASETS = ("ultrachat",)
TABLES = (
    "throughput",
    "quality",
    "cache",
    "budget",
    "depth",
    "leverage",
    "policy",
    "join",
    "staleness",
)


@dataclass(frozen=True)
class Cell:
    """One training run of the grid."""

    data: str
    method: str
    model: str
    mode: str
    nodes: int
    seed: int
    budget: int
    default_budget: int
    epochs: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        name = f"{self.data}.{self.method}.{self.model}-{self.mode}-n{self.nodes}-s{self.seed}"
        if self.budget != self.default_budget:
            name += f".b{self.budget}"
        if self.epochs is not None:
            name += f".e{self.epochs}"
        for key, value in self.options:
            name += f".{key}-{_value(value)}"
        return name


@dataclass
class Grid:
    """Every cell of a config, the tables that read them, and their evaluations."""

    config: Mapping[str, Any]
    variants: dict[str, DataVariant] = field(default_factory=dict)
    cells: dict[str, Cell] = field(default_factory=dict)
    tables: dict[str, list[str]] = field(default_factory=dict)
    evaluated: set[str] = field(default_factory=set)
    odb_layer: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------ building

    def add(self, table: str, cell: Cell) -> str:
        """Put ``cell`` in the grid (once) and in ``table``'s list; its name."""
        if cell.method == "packing" and self.variants[cell.data].dataset not in TEXT_DATASETS:
            raise ValueError(
                f"grid cell {cell.name}: packing is text-only (as in the paper); "
                "remove it from this dataset's methods in the config"
            )
        self.cells.setdefault(cell.name, cell)
        names = self.tables.setdefault(table, [])
        if cell.name not in names:
            names.append(cell.name)
        return cell.name

    def cell(
        self,
        data: str,
        method: str,
        *,
        model: str,
        mode: str,
        nodes: int,
        seed: int,
        budget: int | None = None,
        epochs: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Cell:
        default = self.default_budget(data)
        options = {k: v for k, v in (options or {}).items() if self.odb_layer.get(k, object()) != v}
        return Cell(
            data,
            method,
            model,
            mode,
            int(nodes),
            int(seed),
            int(budget if budget is not None else default),
            default,
            epochs,
            tuple(sorted(options.items())),
        )

    def default_budget(self, data: str) -> int:
        budgets = self.config["train"]["budgets"]
        return int(budgets[self.variants[data].dataset])

    # ------------------------------------------------------------ queries

    def benchmarks(self, name: str) -> list[str]:
        """Benchmarks that score this cell's checkpoint (none outside the evaluated set)."""
        if name not in self.evaluated:
            return []
        kind = (
            "text"
            if self.variants[self.cells[name].data].dataset in TEXT_DATASETS
            else "multimodal"
        )
        return list(self.config["evaluate"]["benchmarks"][kind])

    def eval_files(self, name: str) -> dict[str, str]:
        return {b: f"results/eval/{name}/{b}.json" for b in self.benchmarks(name)}

    def table_inputs(self, table: str) -> list[str]:
        """Result files a table reads: train results, plus evaluations for quality."""
        files = []
        for name in self.tables.get(table, []):
            files.append(f"results/train/{name}/result.json")
            if table == "quality":
                files.extend(self.eval_files(name).values())
        return files

    def data_args(self, data: str) -> dict[str, Any]:
        """The ``DataConfig`` fields of a variant (train overrides and the cache's kwargs
        are both made from this, so their fingerprints agree)."""
        v = self.variants[data]
        t = self.config["train"]
        args: dict[str, Any] = {
            "dataset": v.dataset,
            "source": v.source,
            "processor": processor(self.config),
            "cutoff_len": t["cutoff_len"][v.dataset],
            "image_max_pixels": v.image_max_pixels,
            "max_samples": t["max_samples"][v.dataset],
            "holdout_samples": t["holdout_samples"][v.dataset],
        }
        if t.get("holdout_seed") is not None:
            args["holdout_seed"] = t["holdout_seed"]
        args.update(dict(v.extra))
        if v.augmented:
            args.update(aug_min_scale=v.aug[0], aug_max_scale=v.aug[1])
        return args

    def needs_cache(self, name: str) -> bool:
        return self.cells[name].method in ("sorted", "gmt", "bmt", "packing")

    def train_invocation(self, name: str) -> tuple[list[str], list[str]]:
        """The ``--config`` layers and ``key=value`` overrides of ``experiments.train`` for
        cell ``name``, in order: what its job receives."""
        cell = self.cells[name]
        t = self.config["train"]
        layers = [
            *t["layers"],
            t["models"][cell.model]["layer"],
            f"experiments/configs/method/{cell.method}.yaml",
            f"experiments/configs/mode/{cell.mode}.yaml",
            f"experiments/configs/strategy/{t['strategy']}.yaml",
        ]
        overrides = [f"data.{k}={v}" for k, v in self.data_args(cell.data).items()]
        overrides += [
            f"method.token_budget={cell.budget}",
            f"run.out_dir=results/train/{name}",
            f"run.seed={cell.seed}",
            f"run.scale={self.config['scale']}",
        ]
        if self.needs_cache(name):
            overrides.append(f"method.length_cache=results/cache/{cell.data}.json")
        if t.get("epochs") is not None:  # the workflow's epochs per run; an ablation's win
            overrides.append(f"optim.epochs={t['epochs']}")
        if cell.epochs is not None:
            overrides.append(f"optim.epochs={cell.epochs}")
        model = t["models"][cell.model]
        if model.get("hub"):  # a staged checkpoint, read from the site cache
            overrides.append(f"model.path={staged_model(self.config, model['hub'])}")
        overrides += list(t.get("method_overrides", {}).get(cell.method, []))
        overrides += [f"method.odb.{k}={_value(v)}" for k, v in cell.options]
        overrides += list(t.get("overrides", []))
        overrides += list(t.get("cell_overrides", {}).get(name, []))
        return layers, overrides

    def train_args(self, name: str) -> str:
        """``--config`` layers and ``key=value`` overrides of ``experiments.train``."""
        layers, overrides = self.train_invocation(name)
        return " ".join([*(f"--config {p}" for p in layers), *map(_quote, overrides)])

    def run_order(self) -> list[str]:
        """The order the workflow runs its cells in: grouped by base dataset, then by data
        variant, then in the order the grid added them (each Standard reference first).

        A method's run and its reference's then run minutes apart, not a whole grid apart,
        so a drift in the machine's speed hits both alike (docs/workflow.md, "Timing
        measurements"). Snakemake follows it through :meth:`priority`."""
        names = list(self.cells)
        bases = list(dict.fromkeys(self.variants[c.data].dataset for c in self.cells.values()))
        datas = list(dict.fromkeys(c.data for c in self.cells.values()))

        def key(name: str) -> tuple[int, int, int]:
            cell = self.cells[name]
            base = bases.index(self.variants[cell.data].dataset)
            return base, datas.index(cell.data), names.index(name)

        return sorted(names, key=key)

    def priority(self, name: str) -> int:
        """A train job's Snakemake priority (higher runs first among ready jobs): the
        first cell of :meth:`run_order` gets ``len(cells)``, the last 1."""
        order = self.run_order()
        return len(order) - order.index(name)

    def cache_priority(self, data: str) -> int:
        """A length cache's priority: just above the first cell that needs it, so the cache
        is built when its variant's turn comes (0 when no cell needs it)."""
        users = [self.priority(n) for n, c in self.cells.items()
                 if c.data == data and self.needs_cache(n)]
        return max(users) + 1 if users else 0

    def launcher(self, name: str) -> str:
        """The process launcher: torchrun on one node, srun + torchrun rendezvous on more.

        The template may name ``{nodes}``, ``{procs}`` (ranks per node) and ``{threads}``
        (the job's CPUs per node: ``srun`` takes no ``--cpus-per-task`` from the job since
        Slurm 22.05, so a launcher that starts ranks with ``srun`` passes it on).
        """
        t = self.config["train"]
        nodes = self.cells[name].nodes
        template = t["launcher"] if nodes == 1 else t.get("multinode_launcher")
        if not template:
            raise ValueError(
                f"cell {name} asks for {nodes} nodes but train.multinode_launcher "
                "is not set in the workflow config"
            )
        model = t["models"][self.cells[name].model]
        return template.format(
            nodes=nodes, procs=model["procs_per_node"], threads=model["threads"]
        )

    def manifest(self) -> dict[str, Any]:
        """The JSON the paper scripts read: cells with their attributes and files."""
        cells = {}
        for name, cell in self.cells.items():
            v = self.variants[cell.data]
            cells[name] = {
                "data": cell.data,
                "dataset": v.dataset,
                "method": cell.method,
                "model": cell.model,
                "mode": cell.mode,
                "nodes": cell.nodes,
                "seed": cell.seed,
                "budget": cell.budget,
                "default_budget": cell.default_budget,
                "epochs": cell.epochs,
                "options": dict(cell.options),
                "augmented": v.augmented,
                "tags": dict(v.tags),
                "result": f"results/train/{name}/result.json",
                "evals": self.eval_files(name),
            }
        return {
            "scale": self.config["scale"],
            "scale_note": self.config.get("scale_note", ""),
            "hardware": self.config["hardware"],
            "allow_partial": bool(self.config.get("allow_partial", False)),
            "cells": cells,
            "tables": {t: list(self.tables.get(t, [])) for t in TABLES},
        }


def _value(value: Any) -> str:
    """A setting as the train CLI reads it (YAML): strings bare, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _quote(text: str) -> str:
    return (
        text if re.fullmatch(r"[\w.,:/=+\-\[\]]+", text) else "'" + text.replace("'", "'\\''") + "'"
    )
