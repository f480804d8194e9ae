# Evaluate each checkpoint of the evaluated cells (config `evaluate`): the benchmarks the
# config lists per kind of dataset (validation loss, MMLU on the text dataset, MMMU-MC
# and MMMU generated-answer on the multimodal ones). One JSON per (cell, benchmark),
# schema eval/result.schema.json.


rule evaluate:
    input:
        _eval_inputs,
    output:
        "results/eval/{cell}/{benchmark}.json",
    log:
        "logs/eval/{cell}/{benchmark}.log",
    wildcard_constraints:
        cell="|".join(map(re.escape, GRID.evaluated)) or "NONE",
        benchmark="val_loss|mmlu|mmmu_mc|mmmu_gen",
    params:
        args=_eval_args,
        offline=OFFLINE,
    threads: config["evaluate"]["threads"]
    resources:
        mem_mb=config["evaluate"]["mem_mb"],
        runtime=config["evaluate"]["runtime"],
        cpus_per_task=config["evaluate"]["threads"],
        gres=f"gpu:{config['evaluate']['gpus']}" if config["evaluate"]["gpus"] else "",
    conda:
        "../../environment.yml"
    shell:
        "{params.offline}python -m eval.{wildcards.benchmark} --checkpoint results/train/{wildcards.cell}/final"
        " {params.args} --out {output} > {log} 2>&1"
