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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEXT_DATASETS = ("ultrachat",)
# The ODB settings of experiments/configs/method/odb.yaml: an ablation option equal to one of
# them names the main-grid cell itself (so it is not run twice).
ODB_LAYER = "experiments/configs/method/odb.yaml"
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
# The workflow config's former keys, per section: refused before the schema
# check, whose own message ("'engine' was unexpected") would not name the new key.
RENAMED_KEYS = {  # section -> {old: (new, why)}
    "train": {"engine": ("strategy", "the layer under experiments/configs/strategy/: how the "
                         "model trains across processes; 'engine' now means only DeepSpeed's "
                         "engine object")},
}


@dataclass(frozen=True)
class DataVariant:
    """What a cell trains on: a dataset schema, a source and the settings that change
    lengths (so one length cache serves every cell of a variant)."""

    key: str
    dataset: str
    source: str
    image_max_pixels: int
    aug: tuple[float, float] = (1.0, 1.0)
    extra: tuple[tuple[str, str], ...] = ()  # DataConfig fields beyond these (image_dir)
    tags: tuple[tuple[str, float], ...] = ()  # e.g. leverage cv and short fraction

    @property
    def augmented(self) -> bool:
        return self.aug != (1.0, 1.0)


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

    def _add(self, table: str, cell: Cell) -> str:
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


def processor(config: Mapping[str, Any]) -> str:
    """The tokenizer + image processor: the local tiny one on proxies, else the model's."""
    if config["data"]["source"] == "proxies":
        return "results/data/assets/processor"
    return staged_model(config, config["model"]["processor"])


def stage_cache(config: Mapping[str, Any]) -> str:
    """The site cache every paper-scale job reads (``stage.cache``)."""
    if "stage" not in config:
        raise ValueError("data.source=staged needs a `stage` section naming the site cache "
                         "(stage.cache) and what to stage into it; see config/paper.yaml")
    return str(config["stage"]["cache"]).rstrip("/")


def staged_model(config: Mapping[str, Any], repo: str) -> str:
    """Where a model repository lives once staged; refuses one the stage spec omits."""
    if repo not in config["stage"]["spec"].get("models", []):
        raise ValueError(f"model {repo} is not staged: add it to stage.spec.models in the "
                         "workflow config")
    return f"{stage_cache(config)}/models/{repo}"


def staged(config: Mapping[str, Any], text: str) -> str:
    """``text`` with ``{cache}`` replaced by the site cache (when there is one)."""
    return text.replace("{cache}", stage_cache(config)) if "{cache}" in text else text


def _staged_source(config: Mapping[str, Any], name: str, spec: Mapping[str, Any]) -> str:
    """A dataset's files in the site cache, or the folder its builder rule writes."""
    if spec.get("build"):
        return str(spec["build"])
    repos = config["stage"]["spec"].get("datasets", {})
    if spec.get("hub") not in repos or not spec.get("files"):
        raise ValueError(f"data.datasets.{name}: a staged dataset needs `hub` (a repository "
                         "listed in stage.spec.datasets) and `files` (its pattern inside it), "
                         "or `build` (the folder a rule makes)")
    return f"{stage_cache(config)}/datasets/{spec['hub']}/{spec['files']}"


def _source(config: Mapping[str, Any], name: str, spec: Mapping[str, Any]) -> str:
    if config["data"]["source"] == "proxies":
        return f"results/data/proxies/{name}"
    return _staged_source(config, name, spec)


def _extra(config: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The image folder of a staged dataset (relative paths are inside the site cache)."""
    if config["data"]["source"] == "proxies" or not spec.get("image_dir"):
        return ()
    folder = str(spec["image_dir"])
    if not folder.startswith("/"):
        folder = f"{stage_cache(config)}/{folder}"
    return (("image_dir", folder),)


def _variants(config: Mapping[str, Any]) -> dict[str, DataVariant]:
    out = {}
    for name, spec in config["data"]["datasets"].items():
        out[name] = DataVariant(
            name,
            name,
            _source(config, name, spec),
            int(spec["image_max_pixels"]),
            extra=_extra(config, spec),
        )
    stale = config["ablations"]["staleness"]
    for name in stale["datasets"]:
        base = out[name]
        key = f"{name}-aug{stale['aug'][0]}-{stale['aug'][1]}"
        # its own record count: stale-cache violations are rare events, an epoch needs more
        records = (("max_samples", int(stale["max_samples"])),) if stale.get("max_samples") else ()
        out[key] = DataVariant(
            key,
            base.dataset,
            base.source,
            base.image_max_pixels,
            (float(stale["aug"][0]), float(stale["aug"][1])),
            base.extra + records,
        )
    lev = config["ablations"]["leverage"]
    mmmix = config["data"]["datasets"]["mmmix"]
    for cv, fs in itertools.product(lev["cvs"], lev["short_fractions"]):
        key = leverage_name(cv, fs)
        out[key] = DataVariant(
            key,
            "mmmix",
            f"results/data/leverage/{key}",
            int(mmmix["image_max_pixels"]),
            tags=(("cv", float(cv)), ("short_fraction", float(fs))),
        )
    return out


def leverage_name(cv: float, fs: float) -> str:
    """The folder ``experiments.data.proxies`` writes a leverage mix to."""
    return f"leverage_cv{cv:.2f}_fs{fs:.2f}"


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
    grid = Grid(config, variants=_variants(config), odb_layer=layer)
    for model in config["train"]["models"].values():  # every staged checkpoint is staged
        if model.get("hub"):
            staged_model(config, model["hub"])
    ev = config["evaluate"]
    for block in config["grid"]:
        for spec in _product(block):
            name = grid._add("throughput", grid.cell(spec.pop("data"), spec.pop("method"), **spec))
            cell = grid.cells[name]
            grid._add("quality", cell)  # validation loss from the run; benchmarks if evaluated
            if cell.method in ev["methods"] and cell.mode in ev["modes"]:
                grid.evaluated.add(name)
            if cell.method in ("gmt", "bmt"):
                grid._add("cache", cell)
    for name in list(grid.tables.get("cache", [])):  # the ODB run beside each cache user
        c = grid.cells[name]
        grid._add(
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
        grid._add(table, grid.cell(data, method, **base, **kw))

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
