# Length caches: one full preprocessing pass per data variant, for the methods that plan
# from lengths (Sorted, GMT, BMT, Packing). Its build time, recorded in the cache and
# copied into each train result, is the paper's "cache cost" (ODB needs none).
# The DataConfig fields come from experiments/grid.py, the same ones the train rule
# passes, so the cache's fingerprint matches the run's (a stale one is refused).

rule length_cache:
    input:
        lambda wc: data_inputs(wc.data),
    output:
        "results/cache/{data}.json",
    log:
        "logs/cache/{data}.log",
    wildcard_constraints:
        data="|".join(map(re.escape, GRID.variants)),
    params:
        kwargs=_cache_kwargs,
        # under random augmentation the cache holds epoch 0's draw (later epochs differ)
        epoch=lambda wc: "--epoch 0" if GRID.variants[wc.data].augmented else "",
        workers=config["train"]["cache_workers"],
        # timed passes: the build cost gets a spread like every other timing
        repeats=config["train"].get("cache_repeats", 1),
        offline=OFFLINE,
    threads: max(1, config["train"]["cache_workers"])
    priority: lambda wc: GRID.cache_priority(wc.data)
    resources:
        mem_mb=16000,
        runtime=240,
    conda:
        "../../environment.yml"
    shell:
        "{params.offline}python -m baselines.length_cache build --out {output} --num-workers {params.workers}"
        " --repeats {params.repeats}"
        " --factory experiments.data.pipeline:PreprocessedDataset --kwargs {params.kwargs:q}"
        " {params.epoch} > {log} 2>&1"
