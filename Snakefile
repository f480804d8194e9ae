# ODB artifact workflow. Thin on purpose: rules live in experiments/rules/*.smk by stage,
# the grid (which cells exist, how each runs) in experiments/grid.py.
#
#   snakemake --cores 2            CPU-proxy scale (config/cpu.yaml)
#   snakemake --profile slurm      paper scale on Slurm (the profile selects config/paper.yaml)
#   snakemake --cores 2 ablation_budget     one ablation (targets: docs/workflow.md)
#
# The scale is chosen here and in profiles/slurm only: profiles/default is applied as
# the workflow profile on every run and its keys would win over --profile slurm.

import re

from snakemake.utils import validate

from experiments.grid import build_grid, refuse_renamed


configfile: "config/cpu.yaml"


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
