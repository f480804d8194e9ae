"""`make rehearse` runs the users' own command; only the overlay differs.

Once the rehearsal ran Snakemake with a config the users' command never produced (the
CPU scale merged under the paper's in one, not in the other), so it rehearsed settings
no paper run would get. Here both commands are dry-run (`-n -p`, no Slurm needed) for the
same cell, and the train job's command lines are compared: every difference is a setting
the overlay (`config/rehearsal.yaml`) changes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.rehearsal.run import (
    OVERLAY,
    USERS_COMMAND,
    overlay_args,
    prepare,
    snakemake_command,
)

ROOT = Path(__file__).resolve().parents[2]
CELL = "ultrachat.odb.2b-full-n1-s0"
TARGET = f"results/train/{CELL}/result.json"
# What config/rehearsal.yaml changes in a 1-node training job's command line: the site
# cache's place (stage.cache), records read and held out (train.max_samples,
# holdout_samples), fp32 on CPU (train.overrides), ranks per node (train.models), the scale.
OVERLAY_KEYS = {"data.source", "data.processor", "model.path", "data.max_samples",
                "data.holdout_samples", "model.dtype", "strategy.device", "run.scale",
                "--nproc_per_node"}


def _train_command(command: list[str], cwd: Path) -> list[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run([*command, "-n", "-p", "--forceall"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    line = next(m for m in re.findall(r"^.*-m experiments\.train .*$", out.stdout, re.M))
    return shlex.split(line.split(" > ")[0])


def _settings(words: list[str]) -> dict[str, str]:
    pairs = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words
             if "=" in w and not w.startswith("--")}
    pairs["--nproc_per_node"] = words[words.index("--nproc_per_node") + 1]
    return pairs


def test_the_command_is_the_users_plus_the_overlay(tmp_path: Path) -> None:
    command = snakemake_command(tmp_path, [TARGET], jobs=4)
    assert command == [*USERS_COMMAND, *overlay_args(tmp_path, 4), TARGET]
    assert USERS_COMMAND == ("snakemake", "--profile", "slurm")  # README's paper command


@pytest.mark.slow
def test_the_rehearsals_jobs_differ_from_the_users_only_by_the_overlay(tmp_path: Path) -> None:
    prepare_dir = tmp_path / "rehearsal"
    (prepare_dir / "hub").mkdir(parents=True)
    (prepare_dir / "hub" / "MIRROR.json").write_text("{}")  # no mirror needed for -n
    prepare(prepare_dir, records=24)
    users = _settings(_train_command([*USERS_COMMAND, TARGET], ROOT))
    rehearsal = _settings(_train_command(snakemake_command(prepare_dir, [TARGET], 4), ROOT))
    differ = {k for k in users.keys() | rehearsal.keys() if users.get(k) != rehearsal.get(k)}
    assert differ <= OVERLAY_KEYS, differ - OVERLAY_KEYS
    assert {"data.max_samples", "model.dtype", "run.scale"} <= differ  # the overlay applied
    assert users["optim.epochs"] == rehearsal["optim.epochs"] == "1"
    assert str(OVERLAY) in snakemake_command(prepare_dir, [TARGET], 4)
