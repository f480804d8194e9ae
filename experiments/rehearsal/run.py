"""The paper-path rehearsal: `snakemake --profile slurm` on the paper grid, for real.

    make rehearse                                   # = python -m experiments.rehearsal.run
    python -m experiments.rehearsal.run --slice ci  # the CI slice: one 2-node ODB job + evals

Brings up a local two-node Slurm cluster (`experiments.rehearsal.cluster`, as root), runs
the paper workflow through the real Slurm profile with the overlay `config/rehearsal.yaml`
(the only differences from `config/paper.yaml`: a hub-layout mirror instead of the hub,
CPU devices instead of GPUs, tens of records a cell), then tears the cluster down. Every
job goes through `sbatch` (2-node cells through the launcher's `srun`) except the
`stage` rule, which is a local rule by design (it runs where there is internet).

Slices (which cells of the paper grid run; the grid itself is the paper's):

- ``full``: every method on UltraChat, LLaVA and ShareGPT4o (2B, full, 1 node), a LoRA
  cell, Standard and ODB on MM-Mix over 2 nodes (the MM-Mix built from the staged
  sources), every length cache, every evaluation kind, the policy ablation, the length
  statistics, then every table and the report (``allow_partial``: the tables name the
  cells the slice left out).
- ``ci``: UltraChat ODB on 2 nodes (one c10d rendezvous across both nodes) and its
  validation loss and MMLU evaluations.

The run happens in ``--workdir`` (default ``results/rehearsal``, so it never touches the
CPU reproduction's ``results/``): the mirror in ``hub/``, the site cache in
``site_cache/``, the workflow's outputs in ``results/`` and ``logs/`` below it, and a
summary in ``summary.json`` (phases and their seconds, jobs per rule and how each ran).
The local nodes declare 64 CPUs and ~1 TB each, so the paper's resource requests are
scheduled as written; Snakemake keeps at most ``--jobs`` jobs in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "config" / "rehearsal.yaml"
PAPER = ROOT / "config" / "paper.yaml"
NODE_CPUS = 64          # the paper's cpus_per_task per training job
NODE_MEMORY_MB = 1_100_000  # above the 8B cells' 1,024,000 MB request
# Polled with squeue: the local cluster keeps no accounting database for sacct.
SLURM_ARGS = ("--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks",
              "5", "--slurm-keep-successful-logs")
RECORDS = 24


def _log(message: str) -> None:
    print(f"[rehearsal {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def slice_targets(slice_name: str, config: dict) -> tuple[list[str], list[str]]:
    """(Phase-one targets: runs, caches, evaluations; phase-two targets: tables, report)."""
    from experiments.grid import build_grid

    grid = build_grid(config)
    if slice_name == "ci":
        cell = "ultrachat.odb.2b-full-n2-s0"
        return [f"results/train/{cell}/result.json", *grid.eval_files(cell).values()], []
    cells = [n for n, c in grid.cells.items() if n in grid.tables["throughput"]
             and c.data in ("ultrachat", "llava", "sharegpt4o")
             and (c.model, c.mode, c.nodes, c.seed) == ("2b", "full", 1, 0)]
    cells += ["ultrachat.odb.2b-lora-n1-s0", "mmmix.standard.2b-full-n2-s0",
              "mmmix.odb.2b-full-n2-s0", *grid.tables["policy"]]
    cells = list(dict.fromkeys(cells))
    missing = [c for c in cells if c not in grid.cells]
    if missing:
        raise ValueError(f"the rehearsal slice names cells the paper grid lacks: {missing}")
    evals = [*grid.eval_files("ultrachat.odb.2b-full-n1-s0").values(),
             *grid.eval_files("mmmix.odb.2b-full-n2-s0").values()]
    stats = [f"results/data/length_stats/{d}.json" for d in config["data"]["datasets"]]
    runs = [f"results/train/{c}/result.json" for c in cells]
    return [*runs, *evals, *stats], ["ablation_policy", "results/paper/REPORT.md"]


def workflow_config(*configfiles: Path) -> dict:
    """The config Snakemake sees with ``--configfile`` ``configfiles``: the Snakefile's
    ``config/cpu.yaml``, then each file over it, key by key (Snakemake's own merge)."""
    import yaml
    from snakemake.utils import update_config

    config: dict = {}
    for path in (ROOT / "config" / "cpu.yaml", *configfiles):
        update_config(config, yaml.safe_load(path.read_text()))
    return config


def snakemake(workdir: Path, targets: list[str], jobs: int) -> tuple[int, float]:
    """One `snakemake --profile slurm` over the overlay; (exit code, seconds)."""
    cmd = [sys.executable, "-m", "snakemake", "--profile", "slurm", "-s", str(ROOT / "Snakefile"),
           "--directory", str(workdir), "--configfile", str(PAPER), str(OVERLAY),
           "--jobs", str(jobs), *SLURM_ARGS, *targets]
    _log(f"snakemake --profile slurm ... {len(targets)} targets")
    start = time.monotonic()
    code = subprocess.run(cmd, cwd=workdir, env=_env()).returncode
    return code, time.monotonic() - start


def _env() -> dict[str, str]:
    """PATH with this interpreter first, so every job's `python -m` is this environment."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def prepare(workdir: Path, records: int) -> float:
    """The working directory (the profile by its relative name) and the hub mirror."""
    start = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    for name, target in (("slurm", ROOT / "profiles" / "slurm"),
                         ("experiments", ROOT / "experiments"), ("eval", ROOT / "eval")):
        link = workdir / name
        if not link.exists():
            link.symlink_to(target)
    if not (workdir / "hub" / "MIRROR.json").exists():
        from experiments.rehearsal.hub_mirror import build_mirror

        _log(f"writing the hub mirror ({records} records a dataset) to {workdir / 'hub'}")
        build_mirror(workdir / "hub", records=records, seed=0)
    return time.monotonic() - start


def job_counts(workdir: Path) -> dict[str, dict[str, int]]:
    """Jobs per rule, by how they ran: through sbatch (a Slurm log) or on this host."""
    root = workdir / ".snakemake" / "slurm_logs"  # rule_<name>[/<wildcards>]/<jobid>.log
    slurm = Counter(p.relative_to(root).parts[0].removeprefix("rule_")
                    for p in root.rglob("*.log"))
    local: Counter = Counter()
    for log in (workdir / ".snakemake" / "log").glob("*.snakemake.log"):
        local.update(re.findall(r"^localrule (\w+):", log.read_text(), re.M))
    return {"sbatch": dict(slurm), "local": dict(local)}


def inside(args: argparse.Namespace) -> int:
    """The part that runs with the cluster up (SLURM_CONF set by the cluster runner)."""
    phases, codes = {}, {}
    first, second = slice_targets(args.slice, workflow_config(PAPER, OVERLAY))
    codes["runs"], phases["runs, caches and evaluations"] = snakemake(args.workdir, first,
                                                                      args.jobs)
    if second and not codes["runs"]:
        codes["tables"], phases["tables and report"] = snakemake(args.workdir, second, args.jobs)
    summary = {"slice": args.slice, "exit_codes": codes, "seconds": phases,
               "jobs": job_counts(args.workdir), "targets": first + second}
    (args.workdir / "inside.json").write_text(json.dumps(summary, indent=1) + "\n")
    return max(codes.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slice", choices=["full", "ci"], default="full")
    parser.add_argument("--workdir", type=Path, default=ROOT / "results" / "rehearsal")
    parser.add_argument("--records", type=int, default=RECORDS, help="mirror rows a dataset")
    parser.add_argument("--jobs", type=int, default=4, help="Snakemake jobs in flight")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the cluster's state directory (default /tmp/odb-slurm); a "
                        "cluster already up there is used and left running")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()
    if args.inside:
        return inside(args)
    start = time.monotonic()
    prepare_s = prepare(args.workdir, args.records)
    from experiments.rehearsal import cluster

    code = cluster.run([sys.executable, "-m", "experiments.rehearsal.run", "--inside",
                        "--slice", args.slice, "--workdir", str(args.workdir),
                        "--jobs", str(args.jobs)],
                       args.state_dir or cluster.DEFAULT_STATE_DIR, cpus=NODE_CPUS,
                       memory_mb=NODE_MEMORY_MB)
    inner = args.workdir / "inside.json"
    summary = json.loads(inner.read_text()) if inner.exists() else {}
    summary.update(exit_code=code, total_seconds=round(time.monotonic() - start, 1),
                   mirror_seconds=round(prepare_s, 1))
    (args.workdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
