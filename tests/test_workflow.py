"""The Snakemake workflow dry-runs at both scales, and each profile selects its config."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(*extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--forceall", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_default_profile_runs_cpu_proxy_scale():
    assert "--scale CPU-proxy" in _dry_run("--cores", "1")


def test_slurm_profile_runs_paper_scale():
    assert "--scale paper" in _dry_run("--profile", "slurm")
