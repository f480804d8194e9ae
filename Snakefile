# ODB artifact workflow. Thin on purpose: rules live in experiments/rules/*.smk by stage,
# the grid (which cells exist, how each runs) in experiments/grid.py.
#
#   snakemake --cores 2            CPU-proxy scale (config/cpu.yaml)
#   snakemake --profile slurm      paper scale on Slurm (the profile passes config/paper.yaml)
#   snakemake --profile slurm plan what the paper run will run and cost: results/paper/PLAN.md
#   snakemake --cores 2 ablation_budget     one ablation (targets: docs/workflow.md)
#
# One scale, whole: a config file that names its `scale` (config/paper.yaml) is the run's
# config by itself; without one, config/cpu.yaml is the base under --config values
# (experiments/workflow_config.py). Never a `configfile:` directive here: Snakemake would
# merge it under the paper config key by key. profiles/default is applied as the workflow
# profile on every run, so it holds no scale setting either.

import re

from snakemake.utils import validate

from experiments.grid import build_grid, refuse_renamed
from experiments.workflow_config import effective_config

_EFFECTIVE = effective_config(config)
config.clear()
config.update(_EFFECTIVE)
refuse_renamed(config)  # a former key's error names the new one; the schema's would not
validate(config, "config/schema.yaml")
GRID = build_grid(config)


include: "experiments/rules/common.smk"
include: "experiments/rules/data.smk"
include: "experiments/rules/cache.smk"
include: "experiments/rules/train.smk"
include: "experiments/rules/evaluate.smk"
include: "experiments/rules/paper.smk"
include: "experiments/rules/targets.smk"


rule all:
    input:
        "results/paper/REPORT.md",
        expand("results/data/length_stats/{dataset}.json", dataset=config["data"]["datasets"]),
    default_target: True
