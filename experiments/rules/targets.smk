# Named targets: each reruns one part of the reproduction alone, e.g.
#   snakemake --cores 2 ablation_budget        (or --profile slurm ablation_budget)
# Every paper table is also its own target: table_throughput, table_quality,
# table_cache, table_budget, ... (rules in paper.smk). docs/workflow.md lists them all.


rule ablation_budget:  # token budget L_max sweep (ODB vs Standard)
    input:
        _table("budget"),


rule ablation_depth:  # outstanding depth D sweep, with measured pipeline overlap
    input:
        _table("depth"),


rule ablation_leverage:  # short-sample leverage: CV x f_s on the leverage mixes
    input:
        _table("leverage"),


rule ablation_policy:  # DGAP target policy: paper vs balanced
    input:
        _table("policy"),


rule ablation_join:  # termination: join vs non-join
    input:
        _table("join"),


rule ablation_staleness:  # GMT/BMT on a length cache under augmentation vs ODB
    input:
        _table("staleness"),


rule ablations:
    input:
        [f for t in ("budget", "depth", "leverage", "policy", "join", "staleness")
         for f in _table(t)],


rule train_grid:  # every main-grid cell (the throughput table's runs), no tables
    input:
        [f"results/train/{c}/result.json" for c in GRID.tables["throughput"]],


rule evaluate_grid:  # every evaluation of the main grid
    input:
        [f for c in GRID.tables.get("quality", []) for f in GRID.eval_files(c).values()],


# Target rules only collect files: never worth a cluster job.
localrules:
    all,
    ablation_budget,
    ablation_depth,
    ablation_leverage,
    ablation_policy,
    ablation_join,
    ablation_staleness,
    ablations,
    train_grid,
    evaluate_grid,
