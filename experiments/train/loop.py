"""The training loop: accumulation windows from any method's loader, exact loss, counters.

Separate from set-up (``experiments.train.run``) so the loop reads as what it does: take
one gradient-accumulation window from the strategy (``odb.integrations`` windows), set
the learning rate from the training progress reached before it, run each micro-step,
step the optimizer, count, log, write the training curves (rank 0), checkpoint. Counters
that cover all ranks come from the step info (the loaders exchange them already); the
only trainer-group collectives added here are one all-reduce of the windows' loss sums
(with their token and IDLE counts, for the curves) every ``log_every`` steps and the
checkpoint barriers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

import odb
from experiments.data.pixels import decode_batch
from experiments.train.config import OptimConfig
from experiments.train.curves import Curves, StepPoint
from experiments.train.schedule import build_scheduler

__all__ = ["Counters", "TrainLoop"]

log = logging.getLogger("experiments.train")


@dataclass
class Counters:
    """What a run has done so far; saved in checkpoints, summed over resumed segments.

    ``samples`` is global (all ranks, from the step info); ``real_tokens``,
    ``padded_tokens``, ``idle_steps`` and ``data_wait_s`` are this rank's (the run sums
    the first three over the ranks at the end). Tokens are counted from the batches
    themselves, so every loader is measured the same way. ``epoch_timings`` holds one
    throughput measurement per epoch that ran whole in one segment (``epoch``,
    ``wall_s``, ``samples``, ``steps``, ``data_wait_s``; ``round_ms``, the loader's mean
    alignment round, from loaders that align; rank 0's clock).

    Checkpoint writes are timed apart (``checkpoints``, ``checkpoint_s``; per epoch too)
    and left out of ``train_wall_s`` and every epoch's ``wall_s``: a method that takes
    more optimizer steps saves more often, and its rate must not pay for that. The
    count includes the save a resumed run started from; its seconds were not yet known
    when it was written.
    """

    epoch: int = 0
    optimizer_steps: int = 0
    loader_steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    train_wall_s: float = 0.0
    checkpoints: int = 0
    checkpoint_s: float = 0.0
    data_wait_s: float = 0.0
    loss_curve: list[dict[str, float]] = field(default_factory=list)
    segments: int = 0
    epoch_timings: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def local(self) -> dict[str, Any]:
        """This rank's own counters (saved per rank)."""
        return {name: getattr(self, name) for name in LOCAL_COUNTERS}

    def with_local(self, local: dict[str, Any]) -> Counters:
        """These counters with this rank's own values (zero when none were saved)."""
        return Counters(**{**self.to_dict(), **dict.fromkeys(LOCAL_COUNTERS, 0), **local})


LOCAL_COUNTERS = ("real_tokens", "padded_tokens", "idle_steps", "data_wait_s")
# This rank's counts of one window, summed over the ranks with its loss for the curves.
WINDOW_COUNTS = ("real_tokens", "padded_tokens", "idle_steps")


class _Pending(NamedTuple):
    """An optimizer step whose figures still have to be summed over the ranks."""

    step: int
    loss_sum: torch.Tensor  # this rank's token-loss sum over the window (on the device)
    loss_tokens: int  # the window's global loss tokens
    lr: float
    counts: tuple[int, ...]  # this rank's WINDOW_COUNTS of the window
    wall_s: float  # this rank's wall time of the step


class TrainLoop:
    """Runs epochs of one loader through one strategy.

    Args:
        strategy: `experiments.train.strategy.Strategy`.
        loader: Any loader built by ``baselines.build_loader``.
        dataset: The training dataset (``set_epoch`` reaches its augmentation).
        optim: The schedule's settings (``OptimConfig``); the loop steps its scheduler.
        counters: Where to count (restored on resume).
        fraction: Training progress already reached (restored on resume); the loop
            refuses progress that goes back (an epoch trained twice).
        epochs / max_steps / log_every / save_every: see ``OptimConfig`` and ``RunConfig``.
        save: ``save(counters, schedule_state)``: writes a checkpoint (collective).
        sample_log: Optional open file for per-step sample ids (one JSON line per step).
        progress_bar: Optional tqdm bar, advanced once per optimizer step.
        curves: Optional `experiments.train.curves.Curves` (rank 0): gets every optimizer
            step's point once the loss all-reduce has summed it over the ranks.
    """

    def __init__(self, *, strategy: Any, loader: Any, dataset: Any, optim: OptimConfig,
                 counters: Counters, fraction: float, epochs: int, max_steps: int,
                 log_every: int, save_every: int,
                 save: Callable[[Counters, dict[str, float]], None], sample_log: Any = None,
                 progress_bar: Any = None, curves: Curves | None = None) -> None:
        self.strategy, self.loader, self.dataset = strategy, loader, dataset
        # uint8 pixels (DataConfig.pixels) become the processor's floats on the device.
        self.pixel_codec = getattr(dataset, "pixel_codec", None)
        self.c, self.fraction = counters, fraction
        self.scheduler = build_scheduler(strategy.optimizer, optim, lambda: self.fraction)
        self.epochs, self.max_steps = epochs, max_steps
        self.log_every, self.save_every = log_every, save_every
        self.save, self.sample_log, self.bar = save, sample_log, progress_bar
        self.curves = curves
        self._pending: list[_Pending] = []
        self._started = time.perf_counter()
        self._segment_checkpoint_s = 0.0  # this segment's checkpoint writes, off the clock

    def schedule_state(self) -> dict[str, float]:
        """The schedule's position, for the checkpoint (the rate follows from it)."""
        return {"fraction": self.fraction}

    # ------------------------------------------------------------ epochs

    def run(self) -> Counters:
        """Train until the last epoch ends or ``max_steps`` optimizer steps are done."""
        self.c.segments += 1
        _barrier()  # every rank starts the clock together
        self._started = time.perf_counter()
        self._segment_checkpoint_s = 0.0
        try:
            while self.c.epoch < self.epochs and not self._step_limit():
                self._epoch(self.c.epoch)
                if not self._step_limit():
                    self.c.epoch += 1
            if self.c.epoch >= self.epochs:  # also when resumed after the last epoch's end
                self._advance(1.0)
        finally:
            self._flush_steps()
            self.c.train_wall_s += self._training_s()
        return self.c

    def _training_s(self) -> float:
        """This segment's wall time so far, its checkpoint writes left out."""
        return time.perf_counter() - self._started - self._segment_checkpoint_s

    def _step_limit(self) -> bool:
        return bool(self.max_steps) and self.c.optimizer_steps >= self.max_steps

    def _epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        self.loader.set_epoch(epoch)
        windows = self.strategy.windows(self.loader)
        started, before = self._training_s(), replace(self.c)
        first, cut = None, False  # the progress the epoch started from; the step limit hit
        try:
            for window in windows:
                first = window.progress if first is None else first
                self._advance((epoch + window.progress) / self.epochs)
                self._train_window(window)
                if self._step_limit():
                    cut = True
                    break
        finally:
            windows.close()  # stop the loader's workers if the step limit cut the epoch short
        if first == 0.0 and not cut:  # the whole epoch ran in this segment: one measurement
            self.c.epoch_timings.append(self._timing(epoch, self._training_s() - started, before))

    def _timing(self, epoch: int, wall_s: float, before: Counters) -> dict[str, Any]:
        """One epoch's measurement (see ``Counters``): its wall time, what it emitted, the
        trainer's wait for data, and the loader's mean alignment round when it has one."""
        timing = {
            "epoch": epoch, "wall_s": round(wall_s, 4),
            "samples": self.c.samples - before.samples,
            "steps": self.c.loader_steps - before.loader_steps,
            "data_wait_s": round(self.c.data_wait_s - before.data_wait_s, 4),
            "checkpoints": self.c.checkpoints - before.checkpoints,
            "checkpoint_s": round(self.c.checkpoint_s - before.checkpoint_s, 4)}
        round_ms = self.loader.stats().get("mean_round_ms")
        if round_ms is not None:
            timing["round_ms"] = round(float(round_ms), 3)
        return timing

    def _advance(self, fraction: float) -> None:
        """Move the schedule to ``fraction`` of training: the next window's rate."""
        if fraction < self.fraction - 1e-12:
            raise RuntimeError(f"training progress went backwards: {self.fraction} -> "
                               f"{fraction}; the loader restarted an epoch it had finished")
        self.fraction = fraction
        self.scheduler.step()

    # ------------------------------------------------------------ one window

    def _train_window(self, window: Any) -> None:
        started, before = time.perf_counter(), self._window_counts()
        self.c.data_wait_s += window.wait_s
        lr = self.scheduler.get_last_lr()[0]
        losses = []
        for batch, info in window:
            batch = decode_batch(batch, self.pixel_codec)
            losses.append(self.strategy.micro_step(window, batch, info.loss_normalizer))
            self._count(batch, info)
        loss_sum = torch.stack(losses).sum()
        self.strategy.optimizer_step()
        self.c.optimizer_steps += 1
        counts = tuple(n - b for n, b in zip(self._window_counts(), before, strict=True))
        self._pending.append(_Pending(self.c.optimizer_steps, loss_sum,
                                      max(window.loss_tokens, 1), lr, counts,
                                      window.wait_s + time.perf_counter() - started))
        if self.bar is not None:
            self.bar.update(1)
        if self.c.optimizer_steps % self.log_every == 0:
            self._flush_steps()
            self._log()
        if self.save_every and self.c.optimizer_steps % self.save_every == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Save (collective), timed apart from training (see ``Counters``)."""
        self._flush_steps()  # the checkpoint's loss curve is complete up to here
        if self.curves is not None:
            self.curves.flush()  # and so are the event files, should the run be killed
        self.c.checkpoints += 1
        started = time.perf_counter()
        self.save(replace(self.c, train_wall_s=self.c.train_wall_s + self._training_s(),
                          loss_curve=list(self.c.loss_curve)), self.schedule_state())
        seconds = time.perf_counter() - started
        self.c.checkpoint_s += seconds
        self._segment_checkpoint_s += seconds

    def _count(self, batch: dict[str, Any], info: odb.StepInfo) -> None:
        self.c.loader_steps += 1
        self.c.idle_steps += int(info.idle)
        self.c.samples += info.global_samples
        self.c.real_tokens += 0 if info.idle else _real_tokens(batch)
        self.c.padded_tokens += int(batch["input_ids"].numel())
        if self.sample_log is not None:
            row = {"step": self.c.loader_steps, "epoch": info.epoch, "idle": info.idle,
                   "ids": list(info.sample_ids)}
            self.sample_log.write(json.dumps(row) + "\n")
            self.sample_log.flush()

    # ------------------------------------------------------------ reporting

    def _window_counts(self) -> tuple[int, ...]:
        return tuple(getattr(self.c, name) for name in WINDOW_COUNTS)

    def _flush_steps(self) -> None:
        """All-reduce the pending steps' loss sums and counts (one collective) into global
        figures: the loss curve's points and, on rank 0, the training curves' points."""
        if not self._pending:
            return
        sums = torch.stack([p.loss_sum for p in self._pending]).double()
        counts = torch.tensor([p.counts for p in self._pending], dtype=torch.float64,
                              device=sums.device)
        table = torch.cat([sums[:, None], counts], dim=1)
        if dist.is_initialized():
            dist.all_reduce(table)
        for p, (total, *summed) in zip(self._pending, table.tolist(), strict=True):
            point = {"step": p.step, "loss": total / p.loss_tokens, "lr": p.lr}
            self.c.loss_curve.append(point)
            if self.curves is not None:
                totals = dict(zip(WINDOW_COUNTS, map(round, summed), strict=True))
                self.curves.add(StepPoint(**point, **totals, wall_s=p.wall_s))
        self._pending.clear()

    def _log(self) -> None:
        point = self.c.loss_curve[-1]
        wall = max(self.c.train_wall_s + self._training_s(), 1e-9)
        rate, tokens = self.c.samples / wall, self.c.real_tokens / wall
        line = (f"step {self.c.optimizer_steps} epoch {self.c.epoch} "
                f"loss {point['loss']:.4f} lr {point['lr']:.3g} samples/s {rate:.2f} "
                f"tokens/s (this rank) {tokens:.0f} "
                f"padding eff. {self.c.real_tokens / max(self.c.padded_tokens, 1):.3f}")
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{point['loss']:.3f}", samples_s=f"{rate:.2f}",
                                 tokens_s=f"{tokens:.0f}",
                                 pad_eff=f"{self.c.real_tokens / max(self.c.padded_tokens, 1):.3f}")
        log.info(line)


def _real_tokens(batch: dict[str, Any]) -> int:
    """Unpadded tokens of a batch: its 2-D attention mask's ones; a packed row (4-D
    block mask) has no padding."""
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum())
    return int(batch["input_ids"].numel())


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
