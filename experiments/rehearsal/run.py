"""The paper-path rehearsal: `snakemake --profile slurm` on the paper grid, for real.

    make rehearse                                   # = python -m experiments.rehearsal.run
    python -m experiments.rehearsal.run --slice ci  # the CI slice: one 2-node ODB job + evals

Brings up a local two-node Slurm cluster (`experiments.cluster`, as root), runs
the users' own command, ``snakemake --profile slurm``, from the repository root with the
overlay (:func:`overlay_args`) as its only addition: the overlay config
`config/rehearsal.yaml` over `config/paper.yaml` (a hub-layout mirror instead of the hub,
CPU devices instead of GPUs, tens of records a cell, one cell made to fail on purpose),
a working directory of its own, and the local cluster's site settings. Then it tears the
cluster down. Every job goes through `sbatch` (2-node cells through the launcher's
`srun`) except the `stage` rule, which is a local rule by design (it runs where there is
internet). The profile's `keep-going` lets the grid run past the failed cell; the tables
and the report are made anyway (the overlay's ``allow_partial``) and name it as missing.

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
# The command users type for the paper run (README, docs/workflow.md).
USERS_COMMAND = ("snakemake", "--profile", "slurm")
# The local cluster's site settings: polled with squeue (it keeps no accounting database
# for sacct), a first status check after 5 s, every job's Slurm log kept.
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


def overlay_args(workdir: Path, jobs: int) -> list[str]:
    """What the rehearsal adds to :data:`USERS_COMMAND`, and all of it: the overlay over
    the paper config (a ``--configfile`` replaces the profile's, so both are named), its
    own working directory, jobs in flight for a 2-core host, the local cluster's
    :data:`SLURM_ARGS`."""
    return ["--configfile", str(PAPER), str(OVERLAY), "--directory", str(workdir),
            "--jobs", str(jobs), *SLURM_ARGS]


def snakemake_command(workdir: Path, targets: list[str], jobs: int) -> list[str]:
    """The users' command, the overlay, then the targets (run from the repository root)."""
    return [*USERS_COMMAND, *overlay_args(workdir, jobs), *targets]


def snakemake(workdir: Path, targets: list[str], jobs: int) -> tuple[int, float]:
    """One `snakemake --profile slurm` + the overlay; (exit code, seconds)."""
    _log(f"snakemake --profile slurm ... {len(targets)} targets")
    start = time.monotonic()
    code = subprocess.run(snakemake_command(workdir, targets, jobs), cwd=ROOT,
                          env=_env()).returncode
    return code, time.monotonic() - start


def planted_failures(config: dict) -> list[str]:
    """The cells the overlay makes fail on purpose (``train.cell_overrides``)."""
    return sorted(config["train"].get("cell_overrides", {}))


def _env() -> dict[str, str]:
    """PATH with this interpreter first, so every job's `python -m` is this environment."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def prepare(workdir: Path, records: int) -> float:
    """The working directory (the profile by its relative name) and the hub mirror."""
    start = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    # the jobs run in the working directory and name the config layers by relative path
    for name, target in (("experiments", ROOT / "experiments"), ("eval", ROOT / "eval")):
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
    """The part that runs with the cluster up (SLURM_CONF set by the cluster runner).

    The runs go first; the tables and the report follow whatever failed (the profile's
    keep-going, the overlay's allow_partial). 0 when every target was made but the cells
    the overlay fails on purpose, and those failed."""
    from experiments.workflow_config import load_files

    config = load_files(PAPER, OVERLAY)
    phases, codes = {}, {}
    first, second = slice_targets(args.slice, config)
    codes["runs"], phases["runs, caches and evaluations"] = snakemake(args.workdir, first,
                                                                      args.jobs)
    if second:
        codes["tables"], phases["tables and report"] = snakemake(args.workdir, second, args.jobs)
    missing = [t for t in first + second if not (args.workdir / t).exists()
               and not t.startswith("ablation_")]
    planted = [f"results/train/{c}/result.json" for c in planted_failures(config)
               if f"results/train/{c}/result.json" in first]
    failed = {t: f"logs/train/{t.split('/')[2]}.log" if t.startswith("results/train/") else ""
              for t in missing}
    report = args.workdir / "results" / "paper" / "REPORT.md"
    reported = reported_failures(report) if report.exists() else None
    summary = {"slice": args.slice, "exit_codes": codes, "seconds": phases,
               "jobs": job_counts(args.workdir), "targets": first + second,
               "failed": failed, "failed_on_purpose": planted, "report_failed": reported}
    (args.workdir / "inside.json").write_text(json.dumps(summary, indent=1) + "\n")
    ok = sorted(missing) == sorted(planted) and not codes.get("tables")
    if reported is not None:  # the report names exactly the cells that failed
        ok = ok and sorted(reported) == sorted(t.split("/")[2] for t in planted)
    return 0 if ok else 1


def reported_failures(report: Path) -> list[str]:
    """The cells under the report's "Failed cells" heading (``- `cell`: `log```)."""
    section = report.read_text().partition("## Failed cells")[2].split("\n## ")[0]
    return re.findall(r"^- `([^`]+)`: ", section, re.M)


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
    from experiments import cluster

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
