"""A plain PyTorch loop over an ODB loader: ``DistributedDataParallel`` or one process.

The model's loss is ``sum(token losses) / info.loss_normalizer`` over the whole window
(HF's ``num_items_in_batch``), and DDP averages gradients over the ``W`` ranks: together
the gradient of the global per-token mean, so nothing may rescale again. Micro-steps
accumulate under ``model.no_sync()`` and the window's last one all-reduces, whatever the
window's length (an epoch's last window may be shorter). An IDLE micro-step is ordinary
here: its labels are all masked, its loss an exact zero with a graph, and its backward
fires DDP's hooks like any other. Torch-only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

from odb.integrations.window import Window, adapt_windows, to_device

__all__ = ["DDPWindow", "windows"]


class DDPWindow(Window):
    """A window on ``device`` whose micro-steps hold DDP's all-reduce until the last one."""

    def __init__(self, window: Window, model: torch.nn.Module, device: torch.device | str) -> None:
        super().__init__(window.batches, window.infos, window.progress, window.wait_s)
        self.model, self.device = model, device

    def _micro_step(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        model = self.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not boundary:
            return model.no_sync()
        return contextlib.nullcontext()

    def _place(self, batch: dict[str, Any]) -> dict[str, Any]:
        return to_device(batch, self.device)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, inside the micro-step's synchronisation context."""
        loss.backward()


def windows(
    model: torch.nn.Module, loader: Any, device: torch.device | str = "cpu"
) -> Generator[DDPWindow, None, None]:
    """One epoch of ``loader`` as windows for ``model`` (call ``set_epoch`` first).

    Args:
        model: The ``DistributedDataParallel`` wrapper (or the bare model at one process).
        loader: An ODB loader (or any loader whose batches carry step info).
        device: Where each micro-batch goes.

    Example:
        >>> for window in windows(ddp_model, loader, device):             # doctest: +SKIP
        ...     for batch, info in window:
        ...         loss = ddp_model(**batch, num_items_in_batch=info.loss_normalizer).loss
        ...         window.backward(loss)
        ...     optimizer.step(); optimizer.zero_grad()
    """
    return adapt_windows(loader, lambda window: DDPWindow(window, model, device))
