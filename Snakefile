# ODB artifact workflow. Thin on purpose: rules live in experiments/rules/*.smk.
#
#   snakemake --cores 2            CPU-proxy scale (config/cpu.yaml)
#   snakemake --profile slurm      paper scale on Slurm (the profile selects config/paper.yaml)
#
# The scale is chosen here and in profiles/slurm only: profiles/default is applied as
# the workflow profile on every run and its keys would win over --profile slurm.

configfile: "config/cpu.yaml"


include: "experiments/rules/smoke.smk"
include: "experiments/rules/data.smk"


# Collects targets only; never worth a cluster job.
localrules:
    all,


rule all:
    input:
        rules.smoke.output.json,
        expand("results/data/length_stats/{dataset}.json", dataset=config["data"]["datasets"]),
    default_target: True
