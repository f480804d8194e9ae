# Data stage: proxy datasets (CPU scale), local assets, post-pipeline length statistics,
# and the synthetic leverage mixes (CV x short-sample fraction) of that ablation.
#
# CPU scale (config data.source = proxies): proxies -> assets -> length_stats per dataset.
# Paper scale (data.source = staged): `stage` fetches every model and dataset into the
# site cache once (a local rule: it runs where Snakemake runs, which needs internet, or
# copies a hub-layout mirror in the rehearsal); `mm_mix` composes MM-Mix from it; every
# later job reads the cache offline. The proxy and asset rules are not in the DAG.


rule proxies:
    output:
        directory("results/data/proxies"),
    log:
        "logs/data/proxies.log",
    params:
        samples=config["data"].get("proxy_samples") or 0,
        seed=config["seed"],
    threads: 1
    conda:
        "../../environment.yml"
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "python -m experiments.data.proxies --out {output} --num-samples {params.samples}"
        " --seed {params.seed} > {log} 2>&1"


rule assets:
    input:
        rules.proxies.output,
    output:
        directory("results/data/assets"),
    log:
        "logs/data/assets.log",
    params:
        seed=config["seed"],
    threads: 1
    conda:
        "../../environment.yml"
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "python -m experiments.data.assets --proxies {input} --out {output} --seed {params.seed}"
        " > {log} 2>&1"


rule length_stats:
    input:
        lambda wc: data_inputs(wc.dataset),
    output:
        json="results/data/length_stats/{dataset}.json",
        hist="results/data/length_stats/{dataset}.png",
    log:
        "logs/data/length_stats_{dataset}.log",
    params:
        source=lambda wc: _source(wc.dataset),
        extra=lambda wc: _source_args(wc.dataset),
        processor=processor(config),
        cutoff=config["data"]["cutoff_len"],
        offline=OFFLINE,
    threads: 1
    conda:
        "../../environment.yml"
    resources:
        mem_mb=8000,
        runtime=60,
    shell:
        "{params.offline}python -m experiments.data.length_stats --dataset {wildcards.dataset}"
        " --source {params.source:q} {params.extra} --processor {params.processor}"
        " --cutoff-len {params.cutoff} --hist {output.hist} --out {output.json} > {log} 2>&1"


rule leverage:
    output:
        directory("results/data/leverage"),
    log:
        "logs/data/leverage.log",
    params:
        samples=config["data"]["leverage_samples"],
        cvs=" ".join(map(str, config["ablations"]["leverage"]["cvs"])),
        fs=" ".join(map(str, config["ablations"]["leverage"]["short_fractions"])),
        seed=config["seed"],
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../../environment.yml"
    shell:
        "python -m experiments.data.proxies --out results/data --datasets"
        " --num-samples {params.samples} --leverage-cv {params.cvs} --leverage-fs {params.fs}"
        " --seed {params.seed} > {log} 2>&1"


if STAGED:

    rule stage:
        output:
            STAGE_MANIFEST,
        log:
            "logs/data/stage.log",
        params:
            spec=json.dumps(config["stage"]["spec"], separators=(",", ":")),
            mirror=f"--mirror {config['stage']['mirror']}" if config["stage"].get("mirror") else "",
            cache=lambda wc, output: os.path.dirname(output[0]),
        threads: 1
        conda:
            "../../environment.yml"
        shell:
            "python -m experiments.data.stage --cache {params.cache} {params.mirror}"
            " --spec-json {params.spec:q} > {log} 2>&1"

    localrules:
        stage,

    rule mm_mix:
        input:
            STAGE_MANIFEST,
        output:
            directory(MM_MIX),
        log:
            "logs/data/mm_mix.log",
        params:
            cache=lambda wc, input: os.path.dirname(input[0]),
            args=" ".join(f"--{k.replace('_', '-')} {v}" for k, v in config["data"]["mm_mix"].items()),
            offline=OFFLINE,
        threads: 1
        resources:
            mem_mb=16000,
            runtime=240,
        conda:
            "../../environment.yml"
        shell:
            "{params.offline}python -m experiments.data.mm_mix --cache {params.cache}"
            " --out {output} {params.args} > {log} 2>&1"
