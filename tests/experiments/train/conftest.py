"""Fixtures of the train tests: a tiny saved model and a base config layer over the
session's proxies (tests/experiments/conftest.py), small enough for seconds-long runs;
``train`` (one run of the real entry point, on warm ranks or under torchrun) and
``whole_run`` (Standard's and ODB's uninterrupted runs, made once per session and shared
by the tests that read them)."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from experiments.data.assets import build_tiny_model
from experiments.data.pipeline import PreprocessedDataset
from experiments.train.result import validate_result
from harness.ranks import run_ranks
from harness.torchrun import run_torchrun

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "experiments" / "configs"
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}
# The shared uninterrupted run: 16 training records (8 held out) for 2 epochs, 3
# micro-steps a window, a checkpoint every window. Standard takes 2 samples per rank
# and step at W=2 (budget 2048 // cutoff 1024): 4 steps an epoch, so each epoch ends on
# a short window of 1 step (what the last-window resume test needs).
WHOLE = ("data.max_samples=24", "optim.max_steps=0", "optim.epochs=2",
         "optim.grad_accum_steps=3", "run.save_every=1", "run.keep_checkpoints=100",
         "run.record_sample_ids=true", "validation.enabled=true")
WHOLE_TRAIN_SAMPLES = 16


def train(base: Path, out: Path, *layers: str, overrides: tuple[str, ...] = (),
          world: int = 2, timeout: float = 240, env: dict[str, str] | None = None,
          torchrun: bool = False) -> dict:
    """One run of the train entry point at ``world`` ranks over ``base``, ``layers``
    (relative to experiments/configs) and ``overrides``, into ``out``; its result, checked
    against the result schema. A failed run fails the test with its error.

    The run is ``experiments.train.run.main`` on the session's warm ranks
    (``run_ranks``), in the process group they joined: the entry point's code from its
    arguments on, without a launch and ~5 s of imports a rank. ``torchrun=True`` runs
    ``python -m experiments.train`` under the real launcher instead and keeps its stderr
    in ``out/stderr.log`` (what the launch itself is tested by)."""
    args = ["--config", str(base)]
    for layer in layers:
        args += ["--config", str(CONFIGS / layer)]
    args += [f"run.out_dir={out}", *overrides]
    if torchrun:
        code, _, err = run_torchrun("experiments.train", world, args, timeout=timeout,
                                    env=ENV | (env or {}), module=True)
        (out / "stderr.log").write_text(err)
        assert code == 0, err[-5000:]
    else:
        run_ranks(_train_rank, world, args, timeout=timeout, env=ENV | (env or {}))
    result = json.loads((out / "result.json").read_text())
    validate_result(result)
    return result


def _train_rank(rank: int, world: int, args: list[str]) -> None:
    """One warm rank of :func:`train` (torchrun's per-rank variables, one thread)."""
    import os

    import torch
    import tqdm

    from experiments.train.run import main

    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)  # OMP_NUM_THREADS=1, as under torchrun
    # no tqdm monitor thread (the datasets' bars start one for the process's life): a rank
    # with a thread left running is not clean, so the pool would not reuse it
    tqdm.tqdm.monitor_interval = 0
    main(args)
    assert torch.distributed.is_initialized(), "the run ended its caller's process group"


@pytest.fixture(scope="session")
def tiny_model_dir(processor_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = AutoTokenizer.from_pretrained(processor_dir)
    build_tiny_model(tokenizer, seed=0, out_dir=out)
    tokenizer.save_pretrained(out)
    return out


def base_layer(proxy_root: Path, processor_dir: Path, model_dir: Path, **data) -> dict:
    """The CPU layers plus this session's paths: 40 UltraChat records (8 held out)."""
    return {
        "include": [str(CONFIGS / "scale" / "cpu.yaml"), str(CONFIGS / "model" / "tiny.yaml"),
                    str(CONFIGS / "method" / "odb.yaml"), str(CONFIGS / "mode" / "full.yaml"),
                    str(CONFIGS / "strategy" / "ddp.yaml")],
        "run": {"out_dir": "unset", "log_every": 1},
        "model": {"path": str(model_dir)},
        "data": {"dataset": "ultrachat", "source": str(proxy_root / "ultrachat"),
                 "processor": str(processor_dir), "max_samples": 40, "holdout_samples": 8,
                 "cutoff_len": 1024, **data},
        "method": {"token_budget": 2048, "num_workers": 0},
        "optim": {"max_steps": 3, "lr": 1.0e-3},
        "validation": {"enabled": False},
    }


@pytest.fixture(scope="session")
def base_config(proxy_root: Path, processor_dir: Path, tiny_model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("train_config") / "base.yaml"
    path.write_text(yaml.safe_dump(base_layer(proxy_root, processor_dir, tiny_model_dir)))
    return path


@pytest.fixture(scope="session")
def whole_run(base_config: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Callable[[str], tuple[Path, dict]]:
    """``whole_run(method)``: (its output folder, its result) for ``method`` (standard or
    odb) trained with :data:`WHOLE` overrides, run on first use and kept for the session.
    Read-only: a test that resumes from it copies the folder first."""
    done: dict[str, tuple[Path, dict]] = {}

    def run(method: str) -> tuple[Path, dict]:
        if method not in done:
            out = tmp_path_factory.mktemp(f"whole_{method}")
            done[method] = out, train(base_config, out, f"method/{method}.yaml",
                                      overrides=WHOLE)
        return done[method]

    return run


@pytest.fixture(scope="session")
def ultrachat_train(proxy_root: Path, processor_dir: Path) -> PreprocessedDataset:
    from experiments.data.records import DataConfig

    return PreprocessedDataset(DataConfig("ultrachat", str(proxy_root / "ultrachat"),
                                          str(processor_dir), cutoff_len=1024, max_samples=40,
                                          holdout_samples=8))
