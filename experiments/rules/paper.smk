# Paper stage: result JSON -> tables (Markdown + LaTeX) and figures, one `paper/` script
# each, then results/paper/REPORT.md. The scripts read the grid manifest (which cells a
# table needs) and the result files only; an incomplete grid fails them unless the
# config says `allow_partial: true` (then tables are made from the results that exist,
# nothing is trained for them, and the report lists the missing cells).

rule grid_manifest:
    input:
        "experiments/grid.py",
        "experiments/grid_cells.py",
        "experiments/grid_data.py",
        "experiments/configs/method/odb.yaml",
    output:
        "results/paper/grid.json",
    log:
        "logs/paper/grid_manifest.log",
    params:
        config=lambda wc: json.dumps(config, sort_keys=True, separators=(",", ":")),
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        "../../environment.yml"
    shell:
        "python -m experiments.grid manifest --config-json {params.config:q} --out {output}"
        " > {log} 2>&1"


# The plan before the run: every cell's effective settings with their sources, jobs per
# rule and GPU-hours predicted by the step-cost model, with the range its held-out errors
# give (experiments/plan.py, experiments/plan_cost.py). Local (~30 s): run it before
# submitting the grid, `snakemake --profile slurm plan`.
rule plan:
    input:
        "experiments/grid.py",
        "experiments/grid_cells.py",
        "experiments/grid_data.py",
        "experiments/plan.py",
        "experiments/plan_cost.py",
        "odb/planning/step_cost.py",
        "docs/bench/plan_heldout.json",
    output:
        md="results/paper/PLAN.md",
        json="results/paper/PLAN.json",
    log:
        "logs/paper/plan.log",
    params:
        config=lambda wc: json.dumps(config, sort_keys=True, separators=(",", ":")),
    threads: 1
    conda:
        "../../environment.yml"
    shell:
        "python -m experiments.plan --config-json {params.config:q} --out-dir results/paper"
        " > {log} 2>&1"


localrules:
    plan,


for _name in TABLES:

    rule:
        name:
            f"table_{_name}"
        input:
            grid="results/paper/grid.json",
            results=[] if PARTIAL else GRID.table_inputs(_name),
        output:
            **_paper_outputs(_name),
        log:
            f"logs/paper/{_name}.log",
        params:
            module=f"paper.{_name}",
            partial=PARTIAL,
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        conda:
            "../../environment.yml"
        shell:
            "python -m {params.module} --grid {input.grid} --out-dir results/paper"
            " {params.partial} > {log} 2>&1"


rule report:
    input:
        grid="results/paper/grid.json",
        tables=[f for t in TABLES for f in _paper_outputs(t).values()],
    output:
        "results/paper/REPORT.md",
    log:
        "logs/paper/report.log",
    params:
        partial=PARTIAL,
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        "../../environment.yml"
    shell:
        "python -m paper.report --grid {input.grid} --paper-dir results/paper --out {output}"
        " {params.partial} > {log} 2>&1"
