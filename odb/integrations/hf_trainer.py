"""``ODBTrainer``: a ``transformers.Trainer`` fed by an ODB loader, with the exact loss.

The behaviour lives in :class:`ODBTrainerMixin`, which any ``Trainer`` subclass can take
(``ODBTrainer(ODBTrainerMixin, Trainer)``; TRL's ``SFTTrainer`` in
:mod:`odb.integrations.trl`). What it changes in the Trainer, and why (checked against
transformers 5.24, ``Trainer._inner_training_loop`` / ``training_step`` /
``compute_loss``):

- **Batches**: ``get_train_dataloader`` returns the loader's epochs as they are (no
  sampler, no re-batching, no Accelerate sharding). ``get_batch_samples`` takes one
  accumulation window and pops each batch's step info before ``model(**batch)``.
- **Loss**: every micro-step's loss is ``sum(token losses) / info.loss_normalizer`` (the
  window's global loss tokens / W), so DDP's or DeepSpeed's average over W ranks gives
  the gradient of the global per-token mean of the window. The Trainer's own token
  count is not used. Its ``compute_loss`` multiplies the loss by the process count
  ``k`` when ``average_tokens_across_devices`` is on (to undo its own per-rank mean), so
  the window's ``num_items_in_batch`` is ``loss_normalizer * k``: the model returns
  ``sum / (loss_normalizer * k)`` and the Trainer's ``* k`` leaves exactly
  ``sum / loss_normalizer`` (``k = 1`` when the setting is off). The Trainer's
  ``compute_loss`` (and a subclass's, e.g. TRL's metrics) thus runs unchanged.
  ``loss_is_scaled_for_ga = True`` stops the division by the accumulation steps. Under
  DeepSpeed the Trainer already calls backward with ``scale_wrt_gas=False``.
- **IDLE steps** are ordinary micro-steps (all labels masked: loss 0 with a graph), so
  every rank's backward fires the same collectives. The Trainer closes a window only
  after ``gradient_accumulation_steps`` micro-steps, so the epoch's last, shorter window
  is completed with zero-weight copies of its last batch (labels masked).
- **Epochs and the schedule**: the loader has no length. With ``max_steps > 0`` the
  Trainer's own step-based schedule runs and the loader repeats epochs until then.
  Otherwise the Trainer is given an upper bound of steps per epoch (only to size its
  loop; an epoch ends when the loader does) and the learning rate follows
  ``(epochs done + loader.progress()) / num_train_epochs`` through any LambdaLR-based
  ``lr_scheduler_type`` (:class:`~odb.integrations.schedule.ProgressLR`), ending exactly
  at the last epoch's end.
- **Step total** (``state.max_steps``, the progress bar's total): after every step, the
  steps done plus the loader's estimate of the rest (``loader.estimate_steps()`` and
  ``loader.progress()``), kept above the steps done so that the Trainer's
  ``global_step >= max_steps`` stop never fires early; when the last epoch's data ends
  it becomes the steps done, so the bar ends at 100%.
- **Checkpoints**: each rank writes its loader piece to
  ``checkpoint-N/odb_loader/rank{r}.pt`` when the Trainer saves; ``train(resume_from_
  checkpoint=...)`` loads every piece (at any world size) so the run continues exactly
  once. The Trainer's batch skipping must stay off (``ignore_data_skip=True``): it would
  re-read the data through a plain DataLoader.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from transformers import ProgressCallback, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, get_last_checkpoint

from odb.collate import TensorParts
from odb.core.step_info import StepInfo, pop_step_info
from odb.integrations.schedule import ProgressLR
from odb.integrations.trainer_epochs import LoaderEpochs

__all__ = ["LOADER_STATE_DIR", "ODBTrainer", "ODBTrainerMixin", "load_loader_pieces"]

# Loader pieces live in checkpoint-N/<LOADER_STATE_DIR>/rank{r}.pt.
LOADER_STATE_DIR = "odb_loader"
# Resolution of the progress-driven schedule: the Trainer's schedule functions are
# evaluated at round(fraction * _TICKS) of _TICKS steps.
_TICKS = 1_000_000

# The mixin's methods use the Trainer's attributes and call its methods through super(): a
# type checker reads it as the Trainer subclass it always is part of, the runtime as a
# plain class (so it can go first among any Trainer subclass's bases).
if TYPE_CHECKING:
    _TrainerBase = Trainer
else:
    _TrainerBase = object


class ODBTrainerMixin(_TrainerBase):
    """ODB's training data, exact loss, schedule and resume for a ``transformers.Trainer``.

    Put it first among the bases (``class MyTrainer(ODBTrainerMixin, Trainer)``) and call
    ``_attach_loader`` at the end of ``__init__``, once the Trainer is built. Only
    training changes: evaluation and prediction are the Trainer's own.

    Attributes:
        train_loader: The ODB loader training reads.
        window_infos: The step info of the window being trained (for callbacks).
    """

    # sum(token losses) / normalizer already covers the window
    loss_is_scaled_for_ga: bool | None = True

    def _attach_loader(self, train_loader: Any) -> None:
        """Train from ``train_loader``; raises ValueError on a setting it cannot honour."""
        self.train_loader = train_loader
        self.window_infos: list[StepInfo] = []
        self._check_settings()
        epochs = None if self.args.max_steps > 0 else int(self.args.num_train_epochs)
        self._epochs = LoaderEpochs(train_loader, epochs, _world_size())
        # First of all callbacks: the Trainer's DefaultFlowCallback stops training at
        # global_step >= state.max_steps, so the step total must be updated before it
        # looks, or a low estimate (total = steps done + 1) would end training one step
        # later with data left.
        self.callback_handler.callbacks.insert(0, _LoaderCallback(self))

    def _check_settings(self) -> None:
        args, loader = self.args, self.train_loader
        accum = loader.config.grad_accum_steps
        if args.gradient_accumulation_steps != accum:
            raise ValueError(
                f"gradient_accumulation_steps={args.gradient_accumulation_steps} but the loader "
                f"has grad_accum_steps={accum}: its loss normalizer covers {accum} steps. "
                "Build the loader with the Trainer's gradient_accumulation_steps"
            )
        if not args.ignore_data_skip:
            raise ValueError(
                f"{type(self).__name__} needs ignore_data_skip=True: on resume the ODB "
                "loader continues from its own saved state, exactly once; the Trainer's batch "
                "skipping would re-read the data through a plain DataLoader"
            )
        if args.n_gpu > 1:
            raise ValueError(
                f"n_gpu={args.n_gpu} (torch DataParallel) would split ODB's batches; launch one "
                "process per GPU with torchrun"
            )
        if args.label_smoothing_factor:
            raise ValueError(
                f"label_smoothing_factor={args.label_smoothing_factor}: the label smoother does "
                "not take ODB's normalizer; set it to 0 or pass a compute_loss_func"
            )
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func):
            raise ValueError(
                f"{type(self.model).__name__}.forward takes no num_items_in_batch, so its loss "
                "is a per-batch mean; pass compute_loss_func(outputs, labels, "
                "num_items_in_batch) returning sum(token losses) / num_items_in_batch"
            )
        if args.max_steps > 0:
            return
        if args.num_train_epochs != int(args.num_train_epochs) or args.num_train_epochs < 1:
            raise ValueError(
                f"num_train_epochs={args.num_train_epochs}: without max_steps "
                f"{type(self).__name__} runs whole epochs; give an integer >= 1, or set max_steps"
            )
        if args.warmup_steps >= 1:
            raise ValueError(
                f"warmup_steps={args.warmup_steps} counts steps, but an ODB epoch's steps are "
                "known only at its end; give the warm-up as a fraction of training "
                "(warmup_steps < 1), or set max_steps"
            )
        for name in ("logging_steps", "save_steps", "eval_steps"):
            value = getattr(args, name)
            if value is not None and 0 < value < 1:
                raise ValueError(
                    f"{name}={value} is a ratio of a total step count an ODB run does not "
                    f"know in advance; give {name} as a number of steps, or set max_steps"
                )
        try:
            self.train_loader.progress()
        except TypeError as exc:
            raise ValueError(
                "the loader reads a stream, whose progress is unknown until it ends; set "
                "max_steps (the Trainer's step-based schedule) to train on it"
            ) from exc

    # ------------------------------------------------------------------ data

    # LoaderEpochs is no DataLoader: the Trainer's loop only iterates it and asks its len().
    def get_train_dataloader(self) -> LoaderEpochs:  # type: ignore[override]
        """The loader's epochs, untouched by the Trainer's samplers and Accelerate."""
        return self._epochs

    # The Trainer types the count `Tensor | int | None`; ODB's normaliser is a float (global
    # loss tokens / W), which the loss divides by as it would by an int.
    def get_batch_samples(  # type: ignore[override]
        self, epoch_iterator: Iterator[dict[str, Any]], num_batches: int, device: torch.device
    ) -> tuple[list[dict[str, Any]], float | None]:
        """One accumulation window, step info popped, and its ``num_items_in_batch``.

        ``num_items_in_batch`` is the window's ``loss_normalizer`` times the factor the
        Trainer's ``compute_loss`` multiplies the loss by (``_loss_factor``), so the
        loss it returns is ``sum(token losses) / loss_normalizer``. The epoch's last,
        shorter window is completed to ``num_batches`` micro-steps with zero-weight
        copies of its last batch, because the Trainer steps the optimizer only after
        ``gradient_accumulation_steps`` micro-steps.
        """
        batches: list[dict[str, Any]] = []
        infos: list[StepInfo] = []
        for _ in range(num_batches):
            batch = next(epoch_iterator, None)
            if batch is None:
                break
            infos.append(pop_step_info(batch))
            batches.append(batch)
        self.window_infos = infos
        if not batches:
            self.control.should_epoch_stop = True  # the loader's epoch is over
            self._update_max_steps()  # exact once the last epoch is over
            return [], None
        if len({info.loss_normalizer for info in infos}) > 1:
            raise RuntimeError(
                "the steps of one window carry different loss normalizers: the loader's "
                f"accumulation windows are not {num_batches} steps long"
            )
        cfg = self.train_loader.config
        while len(batches) < num_batches:
            batches.append(_zero_weight(batches[-1], cfg.label_key, cfg.ignore_index))
        return batches, infos[0].loss_normalizer * self._loss_factor()

    def _prepare_input(self, data: Any) -> Any:
        """The Trainer's, plus :class:`odb.TensorParts`: each part moved as the Trainer
        moves a tensor, then concatenated there (one tensor on the device)."""
        prepare = super()._prepare_input
        if isinstance(data, TensorParts):
            return TensorParts([prepare(part) for part in data.parts]).cat()
        return prepare(data)

    # ------------------------------------------------------------------ loss

    def _loss_factor(self) -> int:
        """What ``Trainer.compute_loss`` multiplies a training loss by (transformers 5.24).

        With ``average_tokens_across_devices`` and a loss that takes
        ``num_items_in_batch``, the Trainer assumes the count it gathered over all ranks
        and multiplies by the process count over the tensor-parallel size to undo DDP's
        mean; ODB's normaliser already is the global count over W, so this factor is
        cancelled in ``num_items_in_batch`` (``n_gpu > 1``, where it would be ``n_gpu``, is
        refused).
        """
        args = self.args
        if args.average_tokens_across_devices and (
            self.model_accepts_loss_kwargs or self.compute_loss_func
        ):
            return self.accelerator.num_processes // self.get_tp_size()
        return 1

    # ------------------------------------------------------------------ step total

    def _update_max_steps(self) -> None:
        """``state.max_steps`` and the progress bar's total from the loader's estimate."""
        total = self._epochs.total_steps(self.state.global_step)
        if total is None:
            return
        self.state.max_steps = total
        for callback in self.callback_handler.callbacks:
            bar = getattr(callback, "training_bar", None)
            if isinstance(callback, ProgressCallback) and bar is not None:
                bar.total = total
                bar.refresh()

    # ------------------------------------------------------------------ schedule

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """With ``max_steps``, the Trainer's; else its ``lr_scheduler_type`` over progress."""
        if self.args.max_steps > 0 or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        template = super().create_scheduler(_TICKS, optimizer)
        if not isinstance(template, torch.optim.lr_scheduler.LambdaLR):
            raise ValueError(
                f"lr_scheduler_type={self.args.lr_scheduler_type!r} is not a function of the "
                "step, so it cannot follow the loader's progress; use a LambdaLR-based type "
                "(linear, cosine, constant_with_warmup, ...) or set max_steps"
            )
        lambdas = [_at_fraction(lam) for lam in template.lr_lambdas]
        scheduler = ProgressLR(template.optimizer, lambdas, self._epochs.fraction)
        # The Trainer types the attribute LambdaLR (from its `optimizers` argument) and
        # itself stores any LRScheduler in it, as create_scheduler's return type says.
        self.lr_scheduler = scheduler  # type: ignore[assignment]
        return scheduler

    # ------------------------------------------------------------------ resume

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """``Trainer.train``; a resume also restores the loader from the checkpoint's pieces."""
        if trial is not None:
            raise ValueError(f"{type(self).__name__} does not support hyperparameter search trials")
        checkpoint = None
        if resume_from_checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
            if checkpoint is None:
                raise ValueError(f"no checkpoint found in output_dir {self.args.output_dir!r}")
        elif resume_from_checkpoint:
            checkpoint = resume_from_checkpoint
        if checkpoint:
            self.train_loader.load_state_dict(load_loader_pieces(checkpoint))
            self._epochs.restart()
        return super().train(
            resume_from_checkpoint=checkpoint, ignore_keys_for_eval=ignore_keys_for_eval, **kwargs
        )


class ODBTrainer(ODBTrainerMixin, Trainer):
    """A ``transformers.Trainer`` that trains from an ODB loader with the exact loss.

    Args:
        *args: ``Trainer`` arguments (``model``, ``args``, ...), without ``train_dataset``.
        train_loader: The ODB loader (built after ``TrainingArguments``, which starts the
            process group under ``torchrun``), with ``grad_accum_steps`` equal to
            ``args.gradient_accumulation_steps``.
        **kwargs: Other ``Trainer`` keyword arguments (``data_collator`` applies to
            evaluation only: the loader collates training batches).

    Attributes:
        window_infos: The step info of the window being trained (for callbacks).

    Raises:
        ValueError: A setting the exact loss or the loader cannot honour (named, with
            what to change): a different ``gradient_accumulation_steps``,
            ``ignore_data_skip=False``, DataParallel (``n_gpu > 1``), label smoothing,
            a model without ``num_items_in_batch`` and no ``compute_loss_func``, and
            without ``max_steps``: a fractional ``num_train_epochs``, ``warmup_steps`` >= 1
            or ``logging/save/eval_steps`` < 1 (counts of a step total nobody knows), a
            stream (its progress is unknown).

    Example:
        >>> args = TrainingArguments("out", gradient_accumulation_steps=2,   # doctest: +SKIP
        ...                          ignore_data_skip=True, num_train_epochs=2)
        >>> loader = odb.ODBLoader(dataset, token_budget=4096, grad_accum_steps=2)
        >>> ODBTrainer(model=model, args=args, train_loader=loader).train()
    """

    def __init__(self, *args: Any, train_loader: Any, **kwargs: Any) -> None:
        if "train_dataset" in kwargs or len(args) > 3:
            raise ValueError(
                "ODBTrainer reads training data through train_loader; do not pass train_dataset"
            )
        kwargs["train_dataset"] = train_loader.dataset
        super().__init__(*args, **kwargs)
        self._attach_loader(train_loader)


def load_loader_pieces(checkpoint: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's loader piece saved in a Trainer checkpoint folder.

    Raises:
        FileNotFoundError: The folder holds no loader state (not saved by ODBTrainer).
    """
    paths = sorted(glob.glob(os.path.join(os.fspath(checkpoint), LOADER_STATE_DIR, "rank*.pt")))
    if not paths:
        raise FileNotFoundError(
            f"{checkpoint} holds no {LOADER_STATE_DIR}/rank*.pt: it was not saved by "
            "ODBTrainer, so the loader's position is unknown"
        )
    return [torch.load(path, weights_only=True) for path in paths]


class _LoaderCallback(TrainerCallback):
    """Saves this rank's loader piece with every checkpoint; keeps ``state.epoch`` and
    ``state.max_steps`` (and the progress bar) true to the loader."""

    def __init__(self, trainer: ODBTrainerMixin) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epochs = self.trainer._epochs
        if epochs.epochs is not None:
            state.epoch = epochs.fraction() * epochs.epochs
            self.trainer._update_max_steps()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(
            args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", LOADER_STATE_DIR
        )
        os.makedirs(folder, exist_ok=True)
        # The process group's rank, not args.process_index: TrainingArguments reports
        # rank 0 of 1 on every process under DeepSpeed on CPU (transformers 5.24).
        rank = dist.get_rank() if dist.is_initialized() else 0
        tmp = os.path.join(folder, f".rank{rank}.pt.tmp")
        torch.save(self.trainer.train_loader.state_dict(), tmp)
        os.replace(tmp, os.path.join(folder, f"rank{rank}.pt"))  # never a half-written piece


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _zero_weight(batch: dict[str, Any], label_key: str, ignore_index: int) -> dict[str, Any]:
    """A copy of ``batch`` with every label masked: loss 0 with a graph, zero gradient."""
    if label_key not in batch:
        raise ValueError(f"batch has no {label_key!r} to mask (keys: {sorted(batch)})")
    return {**batch, label_key: torch.full_like(batch[label_key], ignore_index)}


def _at_fraction(lam: Any) -> Any:
    def at_fraction(fraction: float) -> float:
        return lam(round(fraction * _TICKS))

    return at_fraction
