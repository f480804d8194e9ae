"""Every cell of the paper grid builds its loader with its own budget, cutoff and options.

A dry-run only renders command lines, so a cell whose settings cannot run (a fixed batch
size of 0 at cutoff 16384, an option the loader refuses) hid behind it until a job
started on the cluster. Here each cell's train config is loaded from its own layers and
overrides, exactly as its job's command line gives them, and the loader it asks for is
built and planned over samples with paper-scale lengths (no model, no data files).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

import odb
from baselines import build_loader, needs_lengths
from experiments.grid import build_grid
from experiments.train.config import FIXED_BATCH, TrainConfig
from experiments.train.config_files import load_config
from experiments.workflow_config import PAPER_CONFIG, load_files

ROOT = Path(__file__).resolve().parents[2]


def _cell_configs(config: dict) -> dict[str, TrainConfig]:
    grid = build_grid(config)
    out = {}
    for name in grid.cells:
        words = shlex.split(grid.train_args(name))  # the job's own command line
        layers = [ROOT / w for p, w in zip(words, words[1:], strict=False) if p == "--config"]
        overrides = [w for w in words if "=" in w and not w.startswith("--")]
        out[name] = load_config(layers, overrides)
    return out


def _samples(cutoff: int, n: int = 256) -> list[dict[str, torch.Tensor]]:
    """Paper-like lengths: log-normal around 1.5k tokens, a tail up to the cutoff."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(1500), 0.8, n), 16, cutoff).astype(int)
    lengths[:4] = cutoff  # the long tail the fixed-batch methods are sized for
    return [{"input_ids": torch.ones(int(k), dtype=torch.long),
             "labels": torch.ones(int(k), dtype=torch.long)} for k in lengths]


PAPER = _cell_configs(load_files(PAPER_CONFIG))


def _loader_key(cfg: TrainConfig) -> str:
    options = cfg.method.loader_options(cfg.optim.grad_accum_steps, cfg.run.seed,
                                        cfg.data.cutoff_len)
    return json.dumps([cfg.method.name, cfg.method.token_budget, options], sort_keys=True)


def test_every_paper_cell_loads_its_train_config() -> None:
    assert len(PAPER) >= 150
    fixed = [c for c in PAPER.values() if c.method.name in FIXED_BATCH]
    assert fixed and all(c.data.cutoff_len > c.method.token_budget for c in fixed)
    # every paper job needs its GPUs and exits before training without them (issue 42)
    assert {c.strategy.device for c in PAPER.values()} == {"cuda"}


KEYS = sorted({_loader_key(c) for c in PAPER.values()})


def _build(key: str):
    method, budget, options = json.loads(key)
    cutoff = options.get("cutoff_len") or max(c.data.cutoff_len for c in PAPER.values())
    samples = _samples(cutoff)
    lengths = [len(s["input_ids"]) for s in samples] if needs_lengths(method) else None
    return build_loader(method, samples, budget, lengths=lengths, **options), samples


def _id(key: str) -> str:
    method, budget, options = json.loads(key)
    shown = {k: v for k, v in options.items() if k not in ("grad_accum_steps", "seed")}
    return f"{method}-{budget}-" + "-".join(f"{k}={v}" for k, v in sorted(shown.items()))


@pytest.mark.parametrize("key", KEYS, ids=_id)
def test_every_paper_cell_builds_and_plans_its_loader(key: str) -> None:
    loader, samples = _build(key)
    if isinstance(loader, odb.ODBLoader):  # steps are known once it runs: see below
        return
    steps = loader.estimate_steps()
    assert 0 < steps <= len(samples)
    if json.loads(key)[0] in FIXED_BATCH:  # the authors' batch of one sample per GPU
        assert steps == len(samples)


def _odb_option_sets() -> list[str]:
    """One ODB cell per distinct option set (the budget aside): each runs an epoch."""
    firsts: dict[str, str] = {}
    for key in KEYS:
        method, _, options = json.loads(key)
        if method == "odb":
            firsts.setdefault(json.dumps(options, sort_keys=True), key)
    return sorted(firsts.values())


@pytest.mark.dist
@pytest.mark.parametrize("key", _odb_option_sets(), ids=_id)
def test_every_paper_odb_setting_runs_an_epoch_exactly_once(key: str) -> None:
    loader, samples = _build(key)
    seen = [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]
    assert sorted(seen) == list(range(len(samples)))
