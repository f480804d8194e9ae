"""The training loop: windows of micro-steps from any method's loader, exact loss, counters.

Separate from set-up (``experiments.train.run``) so the loop reads as what it does:
take one gradient-accumulation window of batches, set the learning rate from the
training progress reached before it, run each micro-step through the engine, step the
optimizer, count, log, checkpoint. Counters that cover all ranks come from the step
info (the loaders exchange them already); the only trainer-group collectives added here
are one all-reduce of the window losses every ``log_every`` steps and the checkpoint
barriers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

import odb
from experiments.data.pixels import decode_batch

__all__ = ["Counters", "TrainLoop"]

log = logging.getLogger("experiments.train")


@dataclass
class Counters:
    """What a run has done so far; saved in checkpoints, summed over resumed segments.

    ``samples`` is global (all ranks, from the step info); ``real_tokens``,
    ``padded_tokens``, ``idle_steps`` and ``data_wait_s`` are this rank's (the run sums
    the first three over the ranks at the end). Tokens are counted from the batches
    themselves, so every loader is measured the same way.
    """

    epoch: int = 0
    optimizer_steps: int = 0
    loader_steps: int = 0
    idle_steps: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    train_wall_s: float = 0.0
    data_wait_s: float = 0.0
    loss_curve: list[dict[str, float]] = field(default_factory=list)
    segments: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def local(self) -> dict[str, Any]:
        """This rank's own counters (saved per rank)."""
        return {name: getattr(self, name) for name in LOCAL_COUNTERS}

    def with_local(self, local: dict[str, Any]) -> Counters:
        """These counters with this rank's own values (zero when none were saved)."""
        return Counters(**{**self.to_dict(), **dict.fromkeys(LOCAL_COUNTERS, 0), **local})


LOCAL_COUNTERS = ("real_tokens", "padded_tokens", "idle_steps", "data_wait_s")


@dataclass
class _Window:
    batches: list[dict[str, Any]]
    infos: list[odb.StepInfo]


class TrainLoop:
    """Runs epochs of one loader through one engine.

    Args:
        engine: `experiments.train.engine.Engine`.
        loader: Any loader built by ``baselines.build_loader``.
        dataset: The training dataset (``set_epoch`` reaches its augmentation).
        schedule: `experiments.train.schedule.ProgressSchedule`.
        counters: Where to count (restored on resume).
        epochs / grad_accum / max_steps / log_every / save_every: see ``OptimConfig`` and
            ``RunConfig``.
        device: Where batches go.
        save: ``save(counters)``: writes a checkpoint (collective).
        sample_log: Optional open file for per-step sample ids (one JSON line per step).
    """

    def __init__(self, *, engine: Any, loader: Any, dataset: Any, schedule: Any,
                 counters: Counters, epochs: int, grad_accum: int, max_steps: int,
                 log_every: int, save_every: int, device: torch.device,
                 save: Callable[[Counters], None], sample_log: Any = None,
                 progress_bar: Any = None) -> None:
        self.engine, self.loader, self.dataset = engine, loader, dataset
        # uint8 pixels (DataConfig.pixels) become the processor's floats on the device.
        self.pixel_codec = getattr(dataset, "pixel_codec", None)
        self.schedule, self.c = schedule, counters
        self.epochs, self.grad_accum, self.max_steps = epochs, grad_accum, max_steps
        self.log_every, self.save_every = log_every, save_every
        self.device, self.save, self.sample_log = device, save, sample_log
        self.bar = progress_bar
        self._pending: list[tuple[int, torch.Tensor, int, float]] = []
        self._started = time.perf_counter()

    # ------------------------------------------------------------ epochs

    def run(self) -> Counters:
        """Train until the last epoch ends or ``max_steps`` optimizer steps are done."""
        self.c.segments += 1
        _barrier()  # every rank starts the clock together
        self._started = started = time.perf_counter()
        try:
            while self.c.epoch < self.epochs and not self._step_limit():
                self._epoch(self.c.epoch)
                if not self._step_limit():
                    self.c.epoch += 1
                    self.schedule.update(self.c.epoch / self.epochs)  # 1.0 after the last
            if self.c.epoch >= self.epochs:  # also when resumed after the last epoch's end
                self.schedule.update(1.0)
        finally:
            self._flush_losses()
            self.c.train_wall_s += time.perf_counter() - started
        return self.c

    def _step_limit(self) -> bool:
        return bool(self.max_steps) and self.c.optimizer_steps >= self.max_steps

    def _epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        self.loader.set_epoch(epoch)
        batches = iter(self.loader)
        try:
            while not self._step_limit():
                fraction = (epoch + self.loader.progress()) / self.epochs
                window = self._take_window(batches)
                if window is None:
                    break
                lr = self.schedule.update(fraction)
                self._train_window(window, lr)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # stop the loader's workers if the step limit cut the epoch short

    def _take_window(self, batches: Iterator[dict[str, Any]]) -> _Window | None:
        """The next ``grad_accum`` batches (fewer at the epoch's end), None when done.

        Every batch of a window carries the same normalizer; the loaders end a window
        early only at the epoch's end, so a short window is the last one.
        """
        window = _Window([], [])
        while len(window.batches) < self.grad_accum:
            waited = time.perf_counter()
            batch = next(batches, None)
            self.c.data_wait_s += time.perf_counter() - waited
            if batch is None:
                break
            window.infos.append(odb.pop_step_info(batch))
            window.batches.append(batch)
        if len({info.loss_normalizer for info in window.infos}) > 1:
            raise RuntimeError("a window's steps carry different loss normalizers: the "
                               "loader's accumulation windows and the trainer's disagree")
        return window if window.batches else None

    # ------------------------------------------------------------ one window

    def _train_window(self, window: _Window, lr: float) -> None:
        loss_sum = torch.zeros((), device=self.device)
        last = len(window.batches) - 1
        for i, (batch, info) in enumerate(zip(window.batches, window.infos, strict=True)):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            batch = decode_batch(batch, self.pixel_codec)
            loss_sum += self.engine.micro_step(batch, info.loss_normalizer, boundary=i == last)
            self._count(batch, info)
        self.engine.optimizer_step()
        self.c.optimizer_steps += 1
        self._pending.append((self.c.optimizer_steps, loss_sum,
                              max(window.infos[0].accumulation_loss_tokens, 1), lr))
        if self.bar is not None:
            self.bar.update(1)
        if self.c.optimizer_steps % self.log_every == 0:
            self._flush_losses()
            self._log()
        if self.save_every and self.c.optimizer_steps % self.save_every == 0:
            self._flush_losses()  # the checkpoint's loss curve is complete up to here
            elapsed = time.perf_counter() - self._started
            self.save(replace(self.c, train_wall_s=self.c.train_wall_s + elapsed,
                              loss_curve=list(self.c.loss_curve)))

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

    def _flush_losses(self) -> None:
        """All-reduce the pending window loss sums into global per-token means."""
        if not self._pending:
            return
        sums = torch.stack([p[1] for p in self._pending]).double()
        if dist.is_initialized():
            dist.all_reduce(sums)
        for (step, _, tokens, lr), total in zip(self._pending, sums.tolist(), strict=True):
            self.c.loss_curve.append({"step": step, "loss": total / tokens, "lr": lr})
        self._pending.clear()

    def _log(self) -> None:
        point = self.c.loss_curve[-1]
        wall = max(self.c.train_wall_s + time.perf_counter() - self._started, 1e-9)
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
