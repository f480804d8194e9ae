"""A ``fully_shard`` (FSDP2) loop over an ODB loader, with the exact loss and sharded checkpoints.

The model's loss is ``sum(token losses) / info.loss_normalizer`` over the whole window
(HF's ``num_items_in_batch``; the normalizer is the window's global loss tokens over the
loader's ``W`` ranks). FSDP reduce-scatters each gradient and divides it by a divisor
``D``: the data-parallel size (``W``, the shard group times the HSDP replicate group) by
default, or the factor set with ``FSDPModule.set_gradient_divide_factor``. With the
default ``D == W`` and the result is the gradient of the global per-token mean, so
nothing rescales; with a user factor, :meth:`FSDPWindow.backward` multiplies the loss
by ``D / W``, the one correction that undoes the difference (it is 1, and skipped, by
default). Mixed precision (``MixedPrecisionPolicy``) and CPU offload change neither the
samples nor their weights: the divisor is applied in the reduce dtype the same way.

Micro-steps run with ``set_requires_gradient_sync(False)`` and the window's last one
with ``True``, whatever the window's length (an epoch's last window may be shorter), so
each window reduces once. An IDLE micro-step is ordinary: its labels are all masked, its
loss an exact zero with a graph, and its forward and backward run FSDP's all-gathers like
any other rank's.

Refused, before the first step: a model with no ``fully_shard`` state, parameters outside
every FSDP group (their gradients would never be reduced), groups with different
divisors, a user all-reduce hook (a reduction over a group odb cannot see, such as a
hand-made HSDP replicate group), and a data-parallel size other than the loader's
world size (tensor or pipeline parallel dimensions in the mesh).

Checkpoints: :func:`save_checkpoint` writes the sharded model and optimizer with
``torch.distributed.checkpoint`` (DCP) and every rank's own loader piece beside it;
:func:`load_checkpoint` loads them at any world size (DCP reshards the model and the
optimizer, the loader takes every piece). Torch-only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from odb.integrations._fsdp_state import group_reductions, managed_parameters
from odb.integrations.window import Window, adapt_windows, to_device

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["FSDPWindow", "gradient_divisor", "load_checkpoint", "save_checkpoint", "windows"]

MODEL_DIR = "model"  # the DCP checkpoint of the model and the optimizer, in the folder
LOADER_DIR = "loader"  # rank{r}.pt: each rank's loader piece


class FSDPWindow(Window):
    """A window on ``device`` whose micro-steps reduce gradients on the last one only."""

    def __init__(
        self,
        window: Window,
        model: FSDPModule,
        device: torch.device | str,
        parallel: tuple[int, float],
    ) -> None:
        super().__init__(window.batches, window.infos, window.progress, window.wait_s)
        self.model, self.device = model, device
        size, divisor = parallel
        world = window.infos[0].world_size
        if size != world:
            raise ValueError(
                f"the fully_shard model's data-parallel size is {size} but the loader runs on "
                f"{world} ranks; odb.integrations.fsdp drives a mesh whose data-parallel ranks "
                "are the loader's ranks (no tensor or pipeline parallel dimensions)"
            )
        self.loss_scale = divisor / world

    def _micro_step(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        self.model.set_requires_gradient_sync(boundary)
        return contextlib.nullcontext()

    def _place(self, batch: dict[str, Any]) -> dict[str, Any]:
        return to_device(batch, self.device)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, times ``divisor / world_size`` when FSDP's divisor is not ``W``."""
        (loss if self.loss_scale == 1.0 else loss * self.loss_scale).backward()


def gradient_divisor(model: torch.nn.Module) -> tuple[int, float]:
    """``(data-parallel size, divisor)`` of a ``fully_shard`` model's gradient reduction.

    Raises:
        ValueError: No ``fully_shard`` state, parameters outside it, groups that reduce
            differently, or a user all-reduce hook (see the module docstring).
    """
    reductions = group_reductions(model)
    if not reductions:
        raise ValueError(
            f"{type(model).__name__} has no fully_shard state; call "
            "torch.distributed.fsdp.fully_shard on its blocks and on the model itself first"
        )
    managed = managed_parameters(model)
    outside = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in managed]
    if outside:
        raise ValueError(
            f"parameters {outside[:3]} are outside every fully_shard group, so their gradients "
            "are never reduced; call fully_shard on the root module too"
        )
    if any(r.all_reduce_hook for r in reductions):
        raise ValueError(
            "an FSDP all-reduce hook (set_all_reduce_hook) reduces over a group "
            "odb.integrations.fsdp cannot read; use HSDP through a 2-D mesh instead"
        )
    kinds = {(r.shard_size * r.replicate_size, r.divisor) for r in reductions}
    if len(kinds) > 1:
        raise ValueError(
            f"the model's FSDP groups reduce differently ((size, divisor): {sorted(kinds)}); "
            "set_gradient_divide_factor on every fully_shard module, or on none"
        )
    size, divisor = kinds.pop()
    return size, divisor


def windows(
    model: torch.nn.Module, loader: Any, device: torch.device | str = "cpu"
) -> Generator[FSDPWindow, None, None]:
    """One epoch of ``loader`` as windows for a ``fully_shard`` model (call ``set_epoch`` first).

    Args:
        model: The root module ``fully_shard`` was applied to (after its blocks).
        loader: An ODB loader (or any loader whose batches carry step info).
        device: Where each micro-batch goes.

    Raises:
        ValueError: What :func:`gradient_divisor` refuses; a root module that is no
            ``fully_shard`` module (its blocks are); on the first window, a
            data-parallel size other than the loader's world size.

    Example:
        >>> for window in windows(model, loader, device):                 # doctest: +SKIP
        ...     for batch, info in window:
        ...         loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss
        ...         window.backward(loss)
        ...     optimizer.step(); optimizer.zero_grad()
    """
    from torch.distributed.fsdp import FSDPModule

    parallel = gradient_divisor(model)
    if not isinstance(model, FSDPModule):  # only its blocks are: no gradient-sync switch
        raise ValueError(
            f"{type(model).__name__} is no fully_shard module (only modules inside it are); "
            "call torch.distributed.fsdp.fully_shard on the model itself, after its blocks"
        )
    return adapt_windows(loader, lambda window: FSDPWindow(window, model, device, parallel))


def save_checkpoint(
    folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any
) -> None:
    """Save the sharded model and optimizer (DCP) and this rank's loader piece (collective).

    Call it between windows: the loader's state then covers exactly what was trained.
    Each rank writes ``loader/rank{r}.pt`` first and DCP's metadata comes last, so a
    folder whose ``model/.metadata`` exists is complete.

    Example:
        >>> save_checkpoint("ckpt/step_100", model, optimizer, loader)    # doctest: +SKIP
    """
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    (folder / LOADER_DIR).mkdir(parents=True, exist_ok=True)
    torch.save(loader.state_dict(), folder / LOADER_DIR / f"rank{dist.get_rank()}.pt")
    model_state, optim_state = get_state_dict(model, optimizer)
    save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder / MODEL_DIR)


def load_checkpoint(
    folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any
) -> int:
    """Load what :func:`save_checkpoint` wrote, at any world size (collective).

    The model and the optimizer are resharded by DCP onto this run's mesh; the loader
    gets every saved rank's piece (its exactly-once guarantee holds at a new world size).

    Returns:
        The saved epoch, to continue (``loader.set_epoch`` with it resumes mid-epoch).

    Raises:
        FileNotFoundError: ``folder`` holds no complete checkpoint.

    Example:
        >>> epoch = load_checkpoint("ckpt/step_100", model, optimizer, loader)  # doctest: +SKIP
    """
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = Path(folder)
    if not (folder / MODEL_DIR / ".metadata").is_file():
        raise FileNotFoundError(
            f"{folder} is no complete checkpoint: {folder / MODEL_DIR / '.metadata'} is missing "
            "(save_checkpoint writes it last; a run killed while saving leaves none); "
            "load the checkpoint before it"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    # DCP loads in place: into these two dicts' tensors, and their other values set in them.
    load({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder / MODEL_DIR)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    pieces = [torch.load(path) for path in sorted((folder / LOADER_DIR).glob("rank*.pt"))]
    loader.load_state_dict(pieces)
    return loader.epoch
