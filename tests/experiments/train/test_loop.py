"""The train loop in one process: checkpoint writes are counted and timed apart from
training (issue 42: Standard saves about ten times as often as ODB at the same
``save_every``, so a rate with the saves in it favoured ODB)."""

import time
from functools import partial
from pathlib import Path

import torch
from transformers import Qwen3VLForConditionalGeneration

from baselines import build_loader
from experiments.data.pipeline import PreprocessedDataset, collate
from experiments.train.config import OptimConfig, StrategyConfig
from experiments.train.loop import Counters, TrainLoop
from experiments.train.strategy import DDPStrategy

SAVE_SLEEP_S = 1.0  # each save takes at least this long


def _loop(model_dir: Path, dataset: PreprocessedDataset,
          saves: list[tuple[float, float]]) -> TrainLoop:
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    optim = OptimConfig(epochs=2, max_steps=0, lr=1e-4)
    strategy = DDPStrategy(model, StrategyConfig(), optim, 1, torch.device("cpu"))
    loader = build_loader("standard", dataset, 4096, cutoff_len=1024, grad_accum_steps=2,
                          seed=0, num_workers=0,
                          collate_fn=partial(collate, pad_token_id=dataset.tokenizer.pad_token_id))

    def save(counters: Counters, schedule: dict[str, float]) -> None:
        saves.append((time.perf_counter(), counters.train_wall_s))
        time.sleep(SAVE_SLEEP_S)

    return TrainLoop(strategy=strategy, loader=loader, dataset=dataset, optim=optim,
                     counters=Counters(), fraction=0.0, epochs=2, max_steps=0, log_every=1,
                     save_every=2, save=save)


def test_checkpoint_writes_are_counted_and_left_out_of_the_training_clock(
        tiny_model_dir: Path, ultrachat_train: PreprocessedDataset) -> None:
    saves: list[tuple[float, float]] = []  # (the clock, train_wall_s given) at each save
    loop = _loop(tiny_model_dir, ultrachat_train, saves)
    started = time.perf_counter()
    counters = loop.run()
    total_s = time.perf_counter() - started

    assert counters.checkpoints == counters.optimizer_steps // 2 == len(saves) >= 4
    assert counters.checkpoint_s >= SAVE_SLEEP_S * counters.checkpoints
    # Whatever this machine's speed: the training clock holds none of the saves' time,
    # between two saves (the wall clock ran one sleep more than the training clock) and
    # over the run.
    for (clock_a, trained_a), (clock_b, trained_b) in zip(saves, saves[1:], strict=False):
        assert (clock_b - clock_a) - (trained_b - trained_a) >= SAVE_SLEEP_S
    assert counters.train_wall_s <= total_s - counters.checkpoint_s
    timings = counters.epoch_timings
    assert [t["epoch"] for t in timings] == [0, 1]
    assert sum(t["checkpoints"] for t in timings) == counters.checkpoints
    for t in timings:
        assert t["checkpoint_s"] >= SAVE_SLEEP_S * t["checkpoints"]
        assert t["wall_s"] <= counters.train_wall_s
