"""Per-step metadata that travels with every batch, and the boundary that removes it.

Every batch an ODB loader (or a baseline loader) yields is a dict that carries one
:class:`StepInfo` under :data:`STEP_INFO_KEY`. The training loop pops it with
:func:`pop_step_info` before ``model(**batch)``, so the model never sees it.
:func:`finish_batch` is the one place a loader checks a collated batch, masks an IDLE
step's labels and counts the loss tokens its step info reports.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from odb.core.config import LoaderConfig
from odb.core.loss import count_loss_tokens

# The batch key under which every batch carries its StepInfo; pop_step_info removes it.
STEP_INFO_KEY = "odb_step_info"


@dataclass(frozen=True)
class StepInfo:
    """What one aligned step is, identical in shape on every rank.

    Attributes:
        epoch: Epoch the step belongs to.
        step: Index of the step within the epoch (the same on every rank).
        round: Index (within the epoch) of the cross-rank exchange that produced the
            step: ODB's alignment round; a loader that exchanges counts once per
            accumulation window (the baselines) numbers its windows.
        idle: True for an IDLE step: a real one-sample batch whose labels are all
            masked, so it contributes zero gradient while collectives still fire.
        sample_ids: Dataset indices of the samples in this batch (empty when idle).
        local_samples: Samples in this rank's batch (0 when idle).
        global_samples: Samples in this step over all ranks.
        local_loss_tokens: Labels that carry loss in this rank's batch (after the
            causal shift when configured).
        global_loss_tokens: The same, summed over all ranks.
        accumulation_loss_tokens: Global loss tokens of the whole gradient-accumulation
            window this step belongs to.
        loss_normalizer: ``max(accumulation_loss_tokens, 1) / world_size``. Summing the
            token losses of the batch and dividing by this gives, after DDP's gradient
            averaging over ``world_size`` ranks, the gradient of the global per-token
            mean loss of the window. Pass it to HF models as ``num_items_in_batch``.
        world_size: Ranks taking part.
        rank: This rank.
        global_real_tokens: Unpadded tokens of this step over all ranks.
        epoch_read_samples: Samples all ranks had read this epoch when the step's round
            was planned (a random prefix of the shuffled views: used to estimate the
            epoch's total tokens).
        epoch_read_tokens: Their tokens.
        epoch_samples: Samples of the whole epoch over all ranks (0 when unknown: a
            stream, or a single rank, whose loader knows it itself).
    """

    epoch: int
    step: int
    round: int
    idle: bool
    sample_ids: tuple[int, ...]
    local_samples: int
    global_samples: int
    local_loss_tokens: int
    global_loss_tokens: int
    accumulation_loss_tokens: int
    loss_normalizer: float
    world_size: int
    rank: int
    global_real_tokens: int = 0
    epoch_read_samples: int = 0
    epoch_read_tokens: int = 0
    epoch_samples: int = 0

    @property
    def window_loss_tokens(self) -> int:
        """Deprecated name of ``accumulation_loss_tokens`` (kept for old callers)."""
        return self.accumulation_loss_tokens


def pop_step_info(batch: MutableMapping[str, Any]) -> StepInfo:
    """Remove and return the step info of a batch yielded by an ODB loader.

    Example:
        >>> for batch in loader:                                  # doctest: +SKIP
        ...     info = pop_step_info(batch)
        ...     loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss

    Raises:
        TypeError: ``batch`` is not a mutable mapping.
        KeyError: ``batch`` carries no step info (it did not come from an ODB loader,
            or the info was popped already).
    """
    if not isinstance(batch, MutableMapping):
        raise TypeError(
            f"pop_step_info expects the dict batch an ODB loader yields, got {type(batch).__name__}"
        )
    if STEP_INFO_KEY not in batch:
        raise KeyError(
            f"batch has no {STEP_INFO_KEY!r}: it did not come from an ODB "
            "loader, or pop_step_info was already called on it"
        )
    info: StepInfo = batch.pop(STEP_INFO_KEY)
    return info


def finish_batch(batch: Any, config: LoaderConfig, *, idle: bool) -> int:
    """Check a collated batch, mask every label of an IDLE step, return its loss tokens.

    An IDLE step is a real batch (one sample this rank has seen, real shapes) whose
    labels are all ``ignore_index``: it contributes exactly zero loss and gradient
    while the step's collectives still fire. The label tensor is replaced, not written
    in place, so a collate that returns a view of a sample never alters the sample.

    Args:
        batch: What the loader's ``collate_fn`` returned.
        config: The loader's config (``label_key``, ``ignore_index``, ``shift_labels``).
        idle: Whether the batch is an IDLE step.

    Returns:
        Labels that carry loss (0 for an IDLE step), after the causal shift when
        ``config.shift_labels``: the step info's ``local_loss_tokens``.

    Raises:
        TypeError: The batch is not a dict (the step info could not ride along).
        ValueError: The batch has no label tensor under ``config.label_key``.

    Example:
        >>> import torch
        >>> batch = {"labels": torch.tensor([[5, 6, -100]])}
        >>> finish_batch(batch, LoaderConfig(token_budget=8), idle=False)
        1
        >>> finish_batch(batch, LoaderConfig(token_budget=8), idle=True), batch["labels"]
        (0, tensor([[-100, -100, -100]]))
    """
    if not isinstance(batch, MutableMapping):
        raise TypeError(
            f"collate_fn returned a {type(batch).__name__}; the loader needs a dict batch "
            f"so it can attach the step info (popped with odb.pop_step_info)"
        )
    labels = batch.get(config.label_key)
    if labels is None or not hasattr(labels, "new_full"):
        raise ValueError(
            f"collate_fn output has no label tensor {config.label_key!r} (keys: "
            f"{sorted(batch)}); the loader counts loss tokens from it and masks it for "
            "IDLE steps. Set label_key to the field that holds the labels"
        )
    if idle:
        batch[config.label_key] = labels.new_full(labels.shape, config.ignore_index)
    return count_loss_tokens(batch, config.label_key, config.ignore_index, config.shift_labels)
