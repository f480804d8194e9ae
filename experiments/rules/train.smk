# Train each grid cell: `python -m torch.distributed.run ... -m experiments.train` with the
# cell's config layers and overrides (experiments/grid.py). One node: torchrun on the
# node; more: `srun` starts one torchrun per node, which meet through a c10d rendezvous
# on the first node (config train.multinode_launcher). `--resume auto` continues a
# requeued or interrupted run from its newest complete checkpoint.


rule train:
    input:
        _train_inputs,
    output:
        result="results/train/{cell}/result.json",
        final=directory("results/train/{cell}/final"),
    log:
        "logs/train/{cell}.log",
    wildcard_constraints:
        cell="|".join(map(re.escape, GRID.cells)),
    params:
        launcher=lambda wc: GRID.launcher(wc.cell),
        args=lambda wc: GRID.train_args(wc.cell),
        offline=OFFLINE,
    threads: lambda wc: _model(wc)["threads"]
    # grouped by dataset so a run and its reference run close in time (Grid.run_order)
    priority: lambda wc: GRID.priority(wc.cell)
    resources:
        nodes=_nodes,
        mem_mb=lambda wc: _model(wc)["mem_mb"],
        runtime=lambda wc: _model(wc)["runtime"],
        cpus_per_task=lambda wc: _model(wc)["threads"],
        gres=lambda wc: f"gpu:{_model(wc)['gpus_per_node']}" if _model(wc)["gpus_per_node"] else "",
        # Slurm: one task per node, started by the launcher's own `srun` when nodes > 1
        mpi=lambda wc: "srun" if _nodes(wc) > 1 else "",
        tasks=_nodes,
        tasks_per_gpu=0,
    conda:
        "../../environment.yml"
    shell:
        "{params.offline}{params.launcher} -m experiments.train {params.args} --resume auto > {log} 2>&1"
