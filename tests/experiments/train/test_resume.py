"""Kill-and-resume through the real entry point: SIGKILL the whole torchrun group after
a checkpoint, resume with ``--resume auto``, and every training sample of the epoch is
seen exactly once, with the step count of an uninterrupted run."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from experiments.train.config_build import ConfigError
from experiments.train.config_files import load_config
from experiments.train.curves import CURVES_DIR, TAGS
from experiments.train.resume import resolve_resume
from experiments.train.run import main
from harness.processes import kill_tree
from harness.torchrun import torchrun_command
from tests.experiments.train.conftest import CONFIGS, ENV, WHOLE, WHOLE_TRAIN_SAMPLES, train
from tests.experiments.train.test_curves import read_curves

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# 64 training samples, 2 per rank and step at W=2 (budget 2048 // cutoff 1024): Standard's
# epoch is 16 steps whether or not it is interrupted.
RESUMABLE = ("data.max_samples=72", "optim.max_steps=0", "run.save_every=4",
             "run.record_sample_ids=true", "run.keep_checkpoints=10")
STANDARD_STEPS = 16
KILL_AFTER = 4


def _layers(method: str, strategy: str) -> list[str]:
    """The config layers of a run of ``method`` under ``strategy`` (fsdp: with LoRA)."""
    layers = [f"method/{method}.yaml"]
    return layers + (["strategy/fsdp.yaml", "mode/lora.yaml"] if strategy == "fsdp" else [])


def _start(base: Path, out: Path, layers: list[str]) -> subprocess.Popen:
    configs = [arg for layer in layers for arg in ("--config", str(CONFIGS / layer))]
    cmd = torchrun_command("experiments.train", 2, [
        "--config", str(base), *configs, f"run.out_dir={out}", *RESUMABLE], module=True)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **ENV}, start_new_session=True)


def _kill_after_checkpoint(proc: subprocess.Popen, out: Path, timeout: float = 180) -> None:
    marker = out / "checkpoints" / f"step_{KILL_AFTER:06d}" / "COMPLETE"
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            assert proc.poll() is None, f"run ended before its checkpoint: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.02)
        # the launcher and its workers at once: torchrun starts each worker in a session of
        # its own, so killing the launcher's group alone leaves them training (and writing
        # their sample logs) beside the resumed run
        kill_tree([proc.pid], groups=[proc.pid])
        proc.wait(timeout=30)
    finally:
        kill_tree([proc.pid], groups=[proc.pid])
    assert not (out / "result.json").exists(), "the run finished before it was killed"


def _emitted(out: Path) -> list[int]:
    ids = []
    for log in out.glob("samples_rank*.jsonl"):
        for line in log.read_text().splitlines():
            ids += json.loads(line)["ids"]
    return sorted(ids)


# FSDP (LoRA) resumes at W=3: DCP reshards the model and optimizer, the loader re-deals.
@pytest.mark.parametrize(("method", "strategy", "resume_world"),
                         [("standard", "ddp", 2), ("odb", "ddp", 2), ("odb", "fsdp", 3)])
def test_sigkill_then_resume_is_exactly_once(method: str, strategy: str, resume_world: int,
                                             base_config: Path, tmp_path: Path) -> None:
    layers = _layers(method, strategy)
    _kill_after_checkpoint(_start(base_config, tmp_path, layers), tmp_path)
    result = train(base_config, tmp_path, *layers, overrides=("--resume", "auto", *RESUMABLE),
                   world=resume_world)
    assert result["segments"] == 2
    saved = json.loads((tmp_path / "checkpoints" / f"step_{KILL_AFTER:06d}" /
                        "trainer_state.json").read_text())["counters"]
    assert 0 < saved["train_wall_s"] < result["train_wall_s"]  # both segments' time counts
    assert _emitted(tmp_path) == list(range(64)), "a sample lost or seen twice"
    assert result["emitted_samples"] == 64
    assert result["epoch_timings"] == []  # the epoch straddles the kill: no measurement
    if method == "standard":
        assert result["steps"] == STANDARD_STEPS
    steps = list(range(1, result["optimizer_steps"] + 1))
    assert [p["step"] for p in result["loss_curve"]] == steps
    # The training curves too: the killed segment's points up to its checkpoint (flushed
    # before it was saved), the resumed segment's after it, one point a step.
    scalars = read_curves(tmp_path / CURVES_DIR)
    assert {tag: [s for s, _ in scalars[tag]] for tag in TAGS} == dict.fromkeys(TAGS, steps)
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(
        [p["loss"] for p in result["loss_curve"]], rel=1e-6)
    final = json.loads((tmp_path / "final" / "trainer_state.json").read_text())
    assert final["schedule"]["fraction"] == 1.0  # the schedule ends with the epoch


def test_resume_refuses_another_grouping(base_config: Path, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "step_000004"
    folder.mkdir(parents=True)
    saved = load_config([base_config], [f"run.out_dir={tmp_path}"]).to_dict()
    (folder / "trainer_state.json").write_text(json.dumps({"config": saved}))
    (folder / "COMPLETE").write_text("")
    args = ["--config", str(base_config), f"run.out_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="made with method.token_budget=2048, this run has "
                                          "4096"):
        main([*args, "--resume", str(folder), "method.token_budget=4096"])
    assert not dist.is_initialized()
    changed = load_config([base_config], [f"run.out_dir={tmp_path}", "method.token_budget=4096"])
    fresh, note = resolve_resume("auto", tmp_path, changed)  # a rerun after a config change
    assert fresh is None and "made with method.token_budget=2048" in note
    assert "starts fresh instead" in note
    same = load_config([base_config], [f"run.out_dir={tmp_path}"])
    assert resolve_resume("auto", tmp_path, same) == (folder, "")


def _last_window_of_first_epoch(out: Path) -> Path:
    """The checkpoint saved on epoch 0's last window (the next one is in epoch 1)."""
    folders = sorted((out / "checkpoints").glob("step_*"), key=lambda p: p.name)
    epochs = [json.loads((f / "trainer_state.json").read_text())["counters"]["epoch"]
              for f in folders]
    assert 1 in epochs, f"no checkpoint in epoch 1: {epochs}"
    return folders[epochs.index(1) - 1]


@pytest.mark.parametrize("method", ["standard", "odb"])
def test_resume_from_an_epochs_last_window_starts_the_next_epoch(
        method: str, base_config: Path, whole_run, tmp_path: Path) -> None:
    """A checkpoint on an epoch's short last window holds a loader whose epoch is done
    (taking the window met the epoch's end): the resumed run trains the next epoch, not
    the finished one again. The session's uninterrupted run (``whole_run``: 2 epochs,
    3 micro-steps a window, a checkpoint every window) is copied, then resumed from the
    checkpoint on epoch 0's last window."""
    whole_dir, whole = whole_run(method)
    out = tmp_path / "resumed"
    shutil.copytree(whole_dir, out)
    folder = _last_window_of_first_epoch(out)
    saved = json.loads((folder / "trainer_state.json").read_text())["counters"]
    assert saved["loader_steps"] % 3 != 0, "the epoch's last window is not short"
    result = train(base_config, out, f"method/{method}.yaml",
                   overrides=("--resume", str(folder), *WHOLE))
    assert result["segments"] == 2
    n = WHOLE_TRAIN_SAMPLES
    assert _emitted(out) == sorted(list(range(n)) * 2)
    assert result["emitted_samples"] == whole["emitted_samples"] == 2 * n
    assert result["optimizer_steps"] == whole["optimizer_steps"]
    # One throughput measurement per epoch run whole in one segment: both epochs of the
    # uninterrupted run; only epoch 1 of the resumed one (epoch 0 straddles the resume).
    assert [(t["epoch"], t["samples"]) for t in whole["epoch_timings"]] == [(0, n), (1, n)]
    assert [(t["epoch"], t["samples"]) for t in result["epoch_timings"]] == [(1, n)]
    assert sum(t["steps"] for t in whole["epoch_timings"]) == whole["steps"]
    final = json.loads((out / "final" / "trainer_state.json").read_text())
    assert final["schedule"]["fraction"] == 1.0
