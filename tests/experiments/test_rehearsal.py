"""The paper path through `snakemake --profile slurm` on a real local Slurm cluster.

Two checks, each with the paper's own config under the rehearsal overlay
(`config/rehearsal.yaml`), every job through `sbatch`:

- the CI slice of `make rehearse`: stage the hub-layout mirror, train UltraChat with ODB
  on both nodes (one c10d rendezvous, 4 ranks), evaluate its checkpoint (validation loss
  and MMLU from the staged files);
- a training job cancelled by Slurm mid-run (`scancel`) is resubmitted by Snakemake
  (the profile's `retries`) and resumes from its last checkpoint: every sample once.

Both share one mirror and one cluster (module fixtures): each test runs in its own
working directory and Snakemake, on a cluster with no job left from the other.
Both need root (the cluster edits /etc/hosts and runs slurmd); CI runs as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from experiments import cluster
from experiments.rehearsal.hub_mirror import build_mirror
from experiments.rehearsal.run import (
    NODE_CPUS,
    NODE_MEMORY_MB,
    OVERLAY,
    main,
    prepare,
    snakemake_command,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="starts Slurm daemons: run as root (CI does)"),
]
# Mirror rows a dataset: what the resumable run reads (RESUMABLE); the CI slice reads
# the overlay's 24.
RECORDS = 40
# Over the suite's 60 s budget (tests/time_budget.py), for what is not the test's to cut: every
# sbatch job pays Slurm's job start, Snakemake's job-step start (the paper grid parsed
# again) and the training launch (~15 s of imports and DeepSpeed set-up on 2 cores),
# and the Slurm executor polls with back-off (a first check after 5 s, then 10 s longer
# each time no job has finished; a job's end is seen up to ~40 s late). Near idle (load
# 1.7): the CI slice 75 s, the resumed run 51 s (docs/appendix/superseded.md, "Cuts for
# the 60 s budget"); the limits leave room for the executor's polling, not for growth.
SLURM_PATH_REASON = "sbatch jobs: Slurm and Snakemake job starts and the executor's polling"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One hub mirror for both tests (stage only reads it)."""
    out = tmp_path_factory.mktemp("mirror") / "hub"
    build_mirror(out, records=RECORDS, seed=0)
    return out


@pytest.fixture(scope="module")
def slurm() -> Iterator[tuple[Path, dict[str, str]]]:
    """(state dir, client environment) of one cluster up for both tests."""
    # under /tmp, not pytest's 0700 tmp_path: munged runs as the munge user and must reach it
    state_dir = Path(tempfile.mkdtemp(prefix="odb-slurm-", dir="/tmp"))
    try:
        state = cluster.up(state_dir, cpus=NODE_CPUS, memory_mb=NODE_MEMORY_MB)
        yield state_dir, {**cluster.client_env(state.spec),
                          "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    finally:
        cluster.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def _workdir(tmp_path: Path, mirror: Path) -> Path:
    work = tmp_path / "rehearsal"
    work.mkdir()
    (work / "hub").symlink_to(mirror)  # prepare() finds the mirror and keeps it
    return work


@pytest.mark.timeout(1200)
@pytest.mark.time_budget(150, reason=SLURM_PATH_REASON)
def test_ci_slice_trains_on_two_nodes_and_evaluates_through_sbatch(
        tmp_path: Path, mirror: Path, slurm: tuple[Path, dict[str, str]]) -> None:
    work = _workdir(tmp_path, mirror)
    # `make rehearse`'s own entry point; the cluster it finds up is used and left running.
    args = ["--slice", "ci", "--workdir", str(work), "--jobs", "2", "--state-dir",
            str(slurm[0])]
    assert main(args) == 0
    summary = json.loads((work / "summary.json").read_text())
    assert summary["jobs"]["sbatch"] == {"train": 1, "evaluate": 2}, summary
    assert set(summary["jobs"]["local"]) <= {"stage"}  # the one local rule, by design
    cell = "ultrachat.odb.2b-full-n2-s0"
    result = json.loads((work / f"results/train/{cell}/result.json").read_text())
    assert (result["world_size"], result["nodes"], result["method"]) == (4, 2, "odb")
    assert result["emitted_samples"] == 24 - 8  # the overlay's records minus the held-out
    assert result["scale"].startswith("paper-rehearsal")
    assert result["config"]["data"]["source"].startswith("site_cache/datasets/HuggingFaceH4/")
    assert result["config"]["model"]["gradient_checkpointing"]
    for benchmark in ("val_loss", "mmlu"):
        scored = json.loads((work / f"results/eval/{cell}/{benchmark}.json").read_text())
        assert scored["metrics"], benchmark
    staged = json.loads((work / "site_cache" / "STAGED.json").read_text())
    assert "liuhaotian/LLaVA-Instruct-150K" in {e.get("repo") for e in staged["entries"]}
    # MMLU (scored above) was read from a folder staged as snapshot_download stages the hub's
    mmlu = work / "site_cache/datasets/cais/mmlu"
    assert {".cache", "all", "auxiliary_train"} <= {p.name for p in mmlu.iterdir()}
    assert (mmlu / ".cache/huggingface/.gitignore").is_file()


# Far from done when its first checkpoint appears: 32 training samples at Standard's one
# per rank and step, 16 steps, a checkpoint every 4; 12 steps, 3 checkpoints, the
# validation and the final save are left when the job is cancelled.
RESUMABLE = {"train": {"max_samples": {"ultrachat": RECORDS}, "overrides": [
    "model.dtype=float32", "strategy.device=auto", "run.save_every=4", "run.record_sample_ids=true",
    "run.keep_checkpoints=20"]}}
TRAIN_SAMPLES, STEPS = RECORDS - 8, (RECORDS - 8) // 2
CELL = "ultrachat.standard.2b-full-n1-s0"


def _cancel_after_first_checkpoint(work: Path, env: dict[str, str], snake: subprocess.Popen
                                   ) -> None:
    """Cancel the training job (`scancel`) once its first checkpoint is complete.

    A plain cancel, as a preemption or a user's `scancel` delivers it. Not a SIGSTOP first:
    `scancel --signal=STOP` leaves the job in Slurm's STOPPED state, which a later cancel
    can keep (seen on 22.05), and the Slurm executor waits on STOPPED as on a running job.
    The run cannot finish meanwhile: 12 of its 16 steps are left.
    """
    marker = work / f"results/train/{CELL}/checkpoints/step_000004/COMPLETE"
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert snake.poll() is None, "snakemake ended before the first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 10 min"
        time.sleep(0.05)
    jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    assert len(jobs) == 1, jobs
    subprocess.run(["scancel", jobs[0]], env=env, check=True)


@pytest.mark.timeout(1200)
@pytest.mark.time_budget(120, reason=SLURM_PATH_REASON)
def test_a_cancelled_job_is_rerun_by_snakemake_and_resumes_exactly_once(
        tmp_path: Path, mirror: Path, slurm: tuple[Path, dict[str, str]]) -> None:
    work = _workdir(tmp_path, mirror)
    prepare(work, records=RECORDS)
    extra = tmp_path / "resumable.yaml"
    extra.write_text(yaml.safe_dump(RESUMABLE))
    env = slurm[1]
    # Snakemake's output goes to a file: a pipe nobody reads while the test waits for
    # the checkpoint fills up and blocks Snakemake, status checks included.
    log = tmp_path / "snakemake.log"
    with log.open("w") as sink:
        # the users' command + the overlay, as make rehearse runs it, + the test's config
        command = snakemake_command(work, [f"results/train/{CELL}/result.json"], jobs=1)
        command.insert(command.index(str(OVERLAY)) + 1, str(extra))
        snake = subprocess.Popen(
            command,
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _cancel_after_first_checkpoint(work, env, snake)
            snake.wait(timeout=900)
        finally:  # never leave Snakemake behind as a child of the test process
            if snake.poll() is None:
                snake.kill()
                snake.wait()
    assert snake.returncode == 0, log.read_text()[-5000:]
    run = work / f"results/train/{CELL}"
    result = json.loads((run / "result.json").read_text())
    assert result["segments"] == 2, "the rerun did not resume from the checkpoint"
    ids = Counter(i for r in (0, 1) for line in (run / f"samples_rank{r}.jsonl").open()
                  for i in json.loads(line)["ids"])
    assert sorted(ids) == list(range(TRAIN_SAMPLES)) and set(ids.values()) == {1}
    assert result["emitted_samples"] == TRAIN_SAMPLES and result["steps"] == STEPS
    assert len(list((work / ".snakemake/slurm_logs/rule_train").glob("*/*.log"))) == 2
