# Helpers shared by the stage files: input functions and parameters computed from the
# config and the grid (experiments/grid*.py), kept apart from the steps as the Snakemake
# catalog does, so each stage file reads as a list of steps.

import json
import os

from experiments.grid_cells import TABLES
from experiments.grid_data import processor, stage_cache, staged

STAGED = config["data"]["source"] == "staged"
# Every compute job of the paper path reads the site cache only: the hub is never asked.
OFFLINE = "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 " if STAGED else ""
STAGE_MANIFEST = f"{stage_cache(config)}/STAGED.json" if STAGED else None
# The MM-Mix folder the mm_mix rule composes from staged sources (paper scale).
MM_MIX = config["data"]["datasets"]["mmmix"].get("build") if STAGED else None


def _source(dataset):
    return GRID.variants[dataset].source


def _source_args(dataset):
    args = [f"--image-max-pixels {GRID.variants[dataset].image_max_pixels}"]
    for key, value in GRID.variants[dataset].extra:
        args.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(args)


def data_inputs(data):
    """What a data variant reads: generated files at CPU scale; the staged site cache
    (and the MM-Mix built from it) at paper scale."""
    source = GRID.variants[data].source
    assets = ["results/data/assets"] if config["data"]["source"] == "proxies" else []
    assets += [STAGE_MANIFEST] if STAGED else []  # the staged processor
    if source.startswith("results/data/leverage/"):
        return ["results/data/leverage", *assets]
    if source.startswith("results/data/proxies/"):
        return ["results/data/proxies", *assets]
    if source == MM_MIX:
        return [MM_MIX, *assets]
    return assets


def _cache_kwargs(wildcards):
    cfg = {"_target_": "experiments.data.records:DataConfig", **GRID.data_args(wildcards.data)}
    return json.dumps({"cfg": cfg}, separators=(",", ":"))


def _model(wildcards):
    return config["train"]["models"][GRID.cells[wildcards.cell].model]


def _train_inputs(wildcards):
    cell = GRID.cells[wildcards.cell]
    inputs = data_inputs(cell.data)
    if GRID.needs_cache(wildcards.cell):
        inputs.append(f"results/cache/{cell.data}.json")
    return inputs


def _nodes(wildcards):
    return GRID.cells[wildcards.cell].nodes


def _eval_args(wildcards):
    ev = config["evaluate"]
    args = [staged(config, ev["args"][wildcards.benchmark]), ev["device_args"]]
    if wildcards.benchmark == "val_loss":
        # the run's own data settings (hub subset/split, image folder, cutoff, held-out
        # split) from its trainer_state.json: exactly the data it trained on
        args.append(f"--data-from-run --token-budget {GRID.cells[wildcards.cell].budget}")
    return " ".join(a for a in args if a)


def _eval_inputs(wildcards):
    if wildcards.benchmark not in GRID.benchmarks(wildcards.cell):
        raise ValueError(f"{wildcards.benchmark} is not an evaluation of {wildcards.cell} "
                         "(config `evaluate`)")
    inputs = [f"results/train/{wildcards.cell}/final"]
    if wildcards.benchmark == "val_loss":
        inputs += data_inputs(GRID.cells[wildcards.cell].data)
    elif STAGED:  # MMLU / MMMU files and the model's processor, from the site cache
        inputs.append(STAGE_MANIFEST)
    return inputs


# paper table -> whether its script also draws a figure
FIGURES = {"throughput": True, "quality": False, "cache": False, "budget": True,
           "depth": True, "leverage": True, "policy": False, "join": False,
           "staleness": False}


PARTIAL = "--allow-partial" if config.get("allow_partial", False) else ""


def _paper_outputs(table):
    out = {"md": f"results/paper/tables/{table}.md", "tex": f"results/paper/tables/{table}.tex"}
    if FIGURES[table]:
        out["png"] = f"results/paper/figures/{table}.png"
    return out


def _table(name):
    return list(_paper_outputs(name).values())
