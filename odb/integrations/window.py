"""Gradient-accumulation windows of a loader: the micro-steps of one optimizer step.

A loader's accumulation window is ``grad_accum_steps`` consecutive steps sharing one
loss normalizer (the window's global loss tokens over the world size); only the last
window of an epoch may be shorter. :func:`iter_windows` takes one whole window from the
loader before the first micro-step of it runs, and never a batch beyond it, so
``loader.state_dict()`` taken after a window covers exactly what was trained. The
framework adapters build on it: they only add where a batch goes and which micro-step
synchronises gradients. Torch-only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

import torch

from odb.collate import TensorParts
from odb.core.step_info import StepInfo, pop_step_info

__all__ = ["Window", "adapt_windows", "iter_windows", "to_device"]


class Window:
    """The micro-batches of one optimizer step, with their step info popped.

    Iterating yields ``(batch, info)`` per micro-step; adapters subclass it to place the
    batch on a device and to hold gradient synchronisation off until the last micro-step.

    Attributes:
        batches: The micro-batches (step info removed; ready for ``model(**batch)``).
        infos: Their :class:`~odb.core.step_info.StepInfo`, in order.
        progress: ``loader.progress()`` before the window was taken (the fraction of the
            epoch's samples already trained on); None for a stream.
        wait_s: Seconds the caller waited on the loader for the window's batches.

    Example:
        >>> for window in iter_windows(loader):                       # doctest: +SKIP
        ...     for batch, info in window:
        ...         model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
        ...     optimizer.step(); optimizer.zero_grad()
    """

    def __init__(
        self,
        batches: list[dict[str, Any]],
        infos: list[StepInfo],
        progress: float | None,
        wait_s: float = 0.0,
    ) -> None:
        assert batches and len(batches) == len(infos)
        self.batches, self.infos, self.progress = batches, infos, progress
        self.wait_s = wait_s

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def loss_normalizer(self) -> float:
        """What every micro-step of the window passes as ``num_items_in_batch``."""
        return self.infos[0].loss_normalizer

    @property
    def loss_tokens(self) -> int:
        """Global loss tokens of the window (all ranks, all micro-steps)."""
        return self.infos[0].accumulation_loss_tokens

    @property
    def idle_steps(self) -> int:
        """This rank's IDLE micro-steps in the window."""
        return sum(info.idle for info in self.infos)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], StepInfo]]:
        last = len(self.batches) - 1
        for i, (batch, info) in enumerate(zip(self.batches, self.infos, strict=True)):
            with self._micro_step(boundary=i == last):
                yield self._place(batch), info

    def _micro_step(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        """Context the micro-step's forward and backward run in; ``boundary``: the last one."""
        return contextlib.nullcontext()

    def _place(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch


AdaptedWindow = TypeVar("AdaptedWindow", bound=Window)


def iter_windows(loader: Any, grad_accum_steps: int | None = None) -> Generator[Window, None, None]:
    """Iterate one epoch of ``loader`` as accumulation windows (call ``set_epoch`` first).

    Args:
        loader: An ODB loader (or any loader whose batches carry step info).
        grad_accum_steps: Micro-steps per window; default ``loader.config.grad_accum_steps``.

    Raises:
        ValueError: ``grad_accum_steps`` differs from the loader's own setting, or the
            loader has none and none was given.
        RuntimeError: Steps of one window carry different normalizers.
    """
    window = _window_size(loader, grad_accum_steps)
    batches = iter(loader)
    try:
        while True:
            progress = _progress(loader)
            taken: list[dict[str, Any]] = []
            infos: list[StepInfo] = []
            waited = time.perf_counter()
            while len(taken) < window:
                batch = next(batches, None)
                if batch is None:
                    break
                infos.append(pop_step_info(batch))
                taken.append(batch)
            if not taken:
                return
            if len({info.loss_normalizer for info in infos}) > 1:
                raise RuntimeError(
                    "the steps of one window carry different loss normalizers: the loader's "
                    f"accumulation windows are not {window} steps long"
                )
            yield Window(taken, infos, progress, time.perf_counter() - waited)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # stop the loader's collate side when the caller stops early


def adapt_windows(
    loader: Any, adapt: Callable[[Window], AdaptedWindow]
) -> Generator[AdaptedWindow, None, None]:
    """:func:`iter_windows` of ``loader``, each window passed through ``adapt``.

    What the framework adapters return: closing this iterator (or leaving it early)
    closes the loader's epoch at once, as closing :func:`iter_windows` does.
    """
    inner = iter_windows(loader)
    try:
        for window in inner:
            yield adapt(window)
    finally:
        inner.close()


def _window_size(loader: Any, grad_accum_steps: int | None) -> int:
    own = getattr(getattr(loader, "config", None), "grad_accum_steps", None)
    if grad_accum_steps is None:
        if own is None:
            raise ValueError(
                f"{type(loader).__name__} has no config.grad_accum_steps; pass grad_accum_steps"
            )
        return own
    if own is not None and own != grad_accum_steps:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} but the loader's windows are "
            f"config.grad_accum_steps={own} steps long (its normalizer covers that many); "
            "build the loader with the same grad_accum_steps"
        )
    return grad_accum_steps


def _progress(loader: Any) -> float | None:
    try:
        return float(loader.progress())
    except (AttributeError, TypeError):  # no progress(), or a stream of unknown size
        return None


def to_device(batch: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """``batch`` with its tensors moved to ``device`` (other values as they are).

    An :class:`odb.TensorParts` field becomes one tensor, concatenated on ``device``.
    """
    return {
        key: value.to(device, non_blocking=True)
        if isinstance(value, (torch.Tensor, TensorParts))
        else value
        for key, value in batch.items()
    }
