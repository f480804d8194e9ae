# Placeholder main job until the workflow issue lands: proves the pipeline runs end to end.


rule smoke:
    output:
        json="results/smoke/smoke.json",
    log:
        "logs/smoke/smoke.log",
    params:
        scale=config["scale"],
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "python -m experiments.smoke --out {output.json} --scale {params.scale} > {log} 2>&1"
