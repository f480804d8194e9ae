"""A DeepSpeed engine loop over an ODB loader, with the exact loss.

DeepSpeed's ``backward`` divides the loss by its ``gradient_accumulation_steps`` and its
``step`` closes a window after that many micro-steps. ODB's loss is already
``sum(token losses) / info.loss_normalizer`` over the whole window, and an epoch's last
window may be shorter, so :func:`windows` sets each window's boundary explicitly
(``set_gradient_accumulation_boundary``) and :meth:`DeepSpeedWindow.backward` calls
``engine.backward(loss, scale_wrt_gas=False)`` then ``engine.step()`` (a no-op off the
boundary; the optimizer step on it). Works for ZeRO stages 0-2, where an IDLE micro-step's
zero loss still runs the reduce-scatter hooks like any other. The engine's
``gradient_accumulation_steps`` must equal the loader's ``grad_accum_steps`` (DeepSpeed
reports it as the batch size). Does not import ``deepspeed`` itself: it drives the
engine it is given (:func:`skip_cpu_shm_comm_build`, for CPU runs, imports it when
called).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

from odb.integrations.window import Window, adapt_windows, to_device

__all__ = ["DeepSpeedWindow", "skip_cpu_shm_comm_build", "windows"]


class DeepSpeedWindow(Window):
    """A window whose micro-steps run on the engine's device, the boundary set explicitly."""

    def __init__(self, window: Window, engine: Any) -> None:
        super().__init__(window.batches, window.infos, window.progress, window.wait_s)
        self.engine = engine

    def _micro_step(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        self.engine.set_gradient_accumulation_boundary(boundary)
        return contextlib.nullcontext()

    def _place(self, batch: dict[str, Any]) -> dict[str, Any]:
        return to_device(batch, self.engine.device)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward without DeepSpeed's 1/accumulation, then ``engine.step()``.

        On the window's last micro-step the step applies the optimizer (and DeepSpeed's
        gradient clipping and its own scheduler, if it has one).
        """
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()


def windows(engine: Any, loader: Any) -> Generator[DeepSpeedWindow, None, None]:
    """One epoch of ``loader`` as windows for a DeepSpeed engine (call ``set_epoch`` first).

    Raises:
        ValueError: The engine's ``gradient_accumulation_steps()`` differs from the
            loader's ``grad_accum_steps``.

    Example:
        >>> for window in windows(engine, loader):                          # doctest: +SKIP
        ...     for batch, info in window:
        ...         loss = engine(**batch, num_items_in_batch=info.loss_normalizer).loss
        ...         window.backward(loss)
    """
    accum = loader.config.grad_accum_steps
    if engine.gradient_accumulation_steps() != accum:
        raise ValueError(
            f"the DeepSpeed config has gradient_accumulation_steps="
            f"{engine.gradient_accumulation_steps()} but the loader has grad_accum_steps={accum}; "
            "set both to the same number"
        )
    return adapt_windows(loader, lambda window: DeepSpeedWindow(window, engine))


def skip_cpu_shm_comm_build() -> None:
    """On CPU, keep DeepSpeed from JIT-compiling its shared-memory all-reduce op.

    DeepSpeed's comm backend builds the ``deepspeed_shm_comm`` C++ extension when it
    starts (about a minute on 2 cores, and again whenever another environment replaced
    the build in ``~/.cache/torch_extensions``) unless its table of compatible ops
    (``deepspeed.ops.__compatible_ops__``, DeepSpeed 0.19) says no. Only DeepSpeed's
    tensor-parallel inference all-reduce uses that op; ZeRO's collectives go through
    ``torch.distributed`` either way. Call it before the engine (or an HF Trainer with a
    DeepSpeed config) starts; on other accelerators, where the op does not exist, it
    changes nothing.
    """
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
