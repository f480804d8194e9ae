"""Accelerate with an ODB loader: ``prepare`` leaves the loader alone, ``windows`` trains it.

Accelerate's ``prepare`` would shard a ``DataLoader`` over the processes and re-batch
it; an ODB loader is already per rank and aligned, so :func:`prepare` hands it back
untouched and prepares everything else. :func:`windows` then iterates accumulation
windows: each micro-batch on ``accelerator.device``, gradient synchronisation held off
(``accelerator.no_sync``) until the window's last micro-step, whatever its length (the
epoch's last window may be shorter). The loss is the model's ``sum(token losses) /
info.loss_normalizer``; Accelerate's own accumulation must stay at 1, because its
``backward`` divides the loss by ``gradient_accumulation_steps``, a second
normalisation. Imports ``accelerate`` only when called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

from odb.integrations.window import Window, adapt_windows, to_device

__all__ = ["AccelerateWindow", "check_distributed_type", "prepare", "windows"]

# Where ``no_sync`` plus one backward per micro-step is the whole gradient contract.
_SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA")


def check_accelerator(accelerator: Any) -> None:
    """Refuse an Accelerator whose settings would change ODB's exact loss.

    Raises:
        ValueError: ``gradient_accumulation_steps`` != 1, or a distributed type this
            helper does not drive (:func:`check_distributed_type`).
    """
    if accelerator.gradient_accumulation_steps != 1:
        raise ValueError(
            f"Accelerator(gradient_accumulation_steps={accelerator.gradient_accumulation_steps}) "
            "divides every loss by that number, but ODB's normalizer already covers the "
            "window; create the Accelerator with gradient_accumulation_steps=1 and set "
            "the loader's grad_accum_steps instead"
        )
    check_distributed_type(accelerator.distributed_type)


def check_distributed_type(distributed_type: Any) -> None:
    """Refuse a distributed type (DeepSpeed, FSDP, Megatron, XLA) whose gradient handling
    this helper does not drive, naming the helper that does.

    FSDP is refused because its reduction divides by a factor ``no_sync`` and
    ``accelerator.backward`` know nothing of; :mod:`odb.integrations.fsdp` reads it.

    Example:
        >>> check_distributed_type("MULTI_CPU")  # passes; "FSDP" raises ValueError
    """
    kind = str(getattr(distributed_type, "value", distributed_type))
    if kind == "FSDP":
        raise ValueError(
            "distributed_type FSDP (an Accelerate FSDP plugin) is not supported by "
            "odb.integrations.accelerate; shard the model with torch's "
            "torch.distributed.fsdp.fully_shard and train it with odb.integrations.fsdp "
            "(its windows keep the loss exact under FSDP's gradient divide factor)"
        )
    if kind not in _SUPPORTED:
        raise ValueError(
            f"distributed_type {kind} is not supported by odb.integrations.accelerate "
            f"(supported: {_SUPPORTED}); for DeepSpeed use odb.integrations.deepspeed or "
            "odb.integrations.hf_trainer.ODBTrainer"
        )


def prepare(accelerator: Any, *objects: Any) -> Any:
    """``accelerator.prepare(*objects)``, with ODB loaders returned untouched.

    Anything that yields ODB step info (an ``odb.ODBLoader``, a ``baselines`` loader) is
    passed through as it is; models, optimizers, schedulers and ordinary DataLoaders (an
    evaluation set) are prepared by Accelerate.

    Example:
        >>> model, opt, loader = prepare(accelerator, model, opt, loader)  # doctest: +SKIP
    """
    check_accelerator(accelerator)
    keep = [_yields_step_info(obj) for obj in objects]
    others = [obj for obj, kept in zip(objects, keep, strict=True) if not kept]
    prepared = accelerator.prepare(*others) if others else ()
    if len(others) == 1:
        prepared = (prepared,)
    done = iter(prepared)
    out = tuple(obj if kept else next(done) for obj, kept in zip(objects, keep, strict=True))
    return out[0] if len(out) == 1 else out


def _yields_step_info(obj: Any) -> bool:
    from odb.loader import ODBLoader

    if isinstance(obj, ODBLoader):
        return True
    return hasattr(obj, "state_dict") and hasattr(getattr(obj, "config", None), "grad_accum_steps")


class AccelerateWindow(Window):
    """A window whose micro-steps run on ``accelerator.device`` under ``no_sync`` but the last."""

    def __init__(self, window: Window, accelerator: Any, model: torch.nn.Module) -> None:
        super().__init__(window.batches, window.infos, window.progress, window.wait_s)
        self.accelerator, self.model = accelerator, model

    def _micro_step(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if boundary else self.accelerator.no_sync(self.model)

    def _place(self, batch: dict[str, Any]) -> dict[str, Any]:
        return to_device(batch, self.accelerator.device)

    def backward(self, loss: torch.Tensor) -> None:
        """``accelerator.backward(loss)`` (no rescaling: accumulation is 1)."""
        self.accelerator.backward(loss)


def windows(
    accelerator: Any, model: torch.nn.Module, loader: Any
) -> Generator[AccelerateWindow, None, None]:
    """One epoch of ``loader`` as windows for an Accelerate loop (call ``set_epoch`` first).

    Example:
        >>> for window in windows(accelerator, model, loader):            # doctest: +SKIP
        ...     for batch, info in window:
        ...         loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss
        ...         window.backward(loss)
        ...     optimizer.step(); optimizer.zero_grad()
    """
    check_accelerator(accelerator)
    return adapt_windows(loader, lambda window: AccelerateWindow(window, accelerator, model))
