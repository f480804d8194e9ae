"""How the model trains across processes: plain DDP, DeepSpeed ZeRO or torch FSDP2, behind
one interface.

Each strategy turns the loader's epoch into ``odb.integrations`` windows (DDP:
:mod:`odb.integrations.ddp`; DeepSpeed: :mod:`odb.integrations.deepspeed`; FSDP:
:mod:`odb.integrations.fsdp`), runs a micro-step's forward and backward, and applies the
window's gradients; the recipe's loop never touches gradient synchronisation. The loss
contract is the same for all (SPEC 2.4): the model returns ``sum(token losses) /
info.loss_normalizer`` (HF's ``num_items_in_batch``), and gradient averaging over ``W``
ranks turns that into the gradient of the global per-token mean over the window, so no
strategy rescales again. An IDLE step is an ordinary micro-step (all labels masked: an
exact zero loss with a graph, whose backward fires every gradient hook).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from experiments.train.config import OptimConfig, StrategyConfig
from odb.integrations import ddp, deepspeed, fsdp
from odb.integrations.window import Window

__all__ = ["DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy", "Strategy", "make_strategy"]


class Strategy(Protocol):
    """What the train loop needs from a strategy."""

    model: torch.nn.Module  # the unwrapped model (save, evaluate)
    optimizer: torch.optim.Optimizer  # the torch optimizer whose rates the scheduler sets

    def windows(self, loader: Any) -> Iterator[Any]:
        """One epoch of ``loader`` as accumulation windows, batches on the device."""
        ...

    def micro_step(self, window: Any, batch: dict[str, Any], normalizer: float) -> torch.Tensor:
        """Forward + backward of one micro-batch of ``window``; its loss sum (detached)."""
        ...

    def optimizer_step(self) -> None:
        """Apply the window's gradients (after its last micro-step)."""
        ...

    def save(self, folder: Path, rank: int) -> None: ...
    def load(self, folder: Path) -> None: ...

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole model's state on rank 0 to export, or None where
        ``model.state_dict()`` is whole on every rank already."""
        ...


def _optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("no trainable parameters: check mode, lora.target_modules and "
                         "model.train_vision")
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def _clip_and_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                   cfg: OptimConfig) -> None:
    """Clip the window's gradients (``max_grad_norm`` > 0), step, and clear them; FSDP's
    sharded gradients are clipped by their global norm the same way."""
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class DDPStrategy:
    """``DistributedDataParallel`` (or the bare model at one rank) and a torch optimizer."""

    def __init__(self, model: torch.nn.Module, cfg: StrategyConfig, optim: OptimConfig,
                 world_size: int, device: torch.device) -> None:
        self.model, self.optim_cfg, self.device = model, optim, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _optimizer(self.params, optim)
        self.wrapped: torch.nn.Module = model
        if world_size > 1:
            # A text-only batch leaves a trainable vision tower without gradients.
            vision_trains = any(p.requires_grad for n, p in model.named_parameters()
                                if ".visual." in f".{n}")
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                model, find_unused_parameters=cfg.find_unused_parameters or vision_trains)

    def windows(self, loader: Any) -> Iterator[Window]:
        return ddp.windows(self.wrapped, loader, self.device)

    def micro_step(self, window: Any, batch: dict[str, Any], normalizer: float) -> torch.Tensor:
        return _forward_backward(self.wrapped, window, batch, normalizer)

    def optimizer_step(self) -> None:
        _clip_and_step(self.params, self.optimizer, self.optim_cfg)

    def save(self, folder: Path, rank: int) -> None:
        if rank == 0:  # optimizer state is replicated under DDP
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state)

    def full_state_dict(self) -> None:
        return None


class DeepSpeedStrategy:
    """A DeepSpeed engine (ZeRO stage 0-2) around the model and a torch optimizer.

    Gradient clipping and bf16 master weights are DeepSpeed's; the optimizer steps inside
    the window's last backward (:meth:`odb.integrations.deepspeed.DeepSpeedWindow.backward`).
    Its checkpoint (model and partitioned optimizer states) is written collectively
    under ``deepspeed/``.
    """

    def __init__(self, model: torch.nn.Module, cfg: StrategyConfig, optim: OptimConfig,
                 bf16: bool) -> None:
        import deepspeed as ds

        deepspeed.skip_cpu_shm_comm_build()
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _optimizer(params, optim)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": optim.grad_accum_steps,
            "gradient_clipping": optim.max_grad_norm,
            "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": False,
                                  "contiguous_gradients": True},
            "bf16": {"enabled": bf16},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, _ = ds.initialize(model=model, model_parameters=params,
                                             optimizer=self.optimizer, config=config)

    def windows(self, loader: Any) -> Iterator[Window]:
        return deepspeed.windows(self.engine, loader)

    def micro_step(self, window: Any, batch: dict[str, Any], normalizer: float) -> torch.Tensor:
        # The window's backward is the engine's: it steps the optimizer on the boundary.
        return _forward_backward(self.engine, window, batch, normalizer)

    def optimizer_step(self) -> None:
        """Nothing left: the window's last backward stepped the engine's optimizer."""

    def save(self, folder: Path, rank: int) -> None:
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state")

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder / "deepspeed"), tag="state",
                                              load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {folder / 'deepspeed'}")

    def full_state_dict(self) -> None:
        return None  # ZeRO 0-2 keep whole weights on every rank


class FSDPStrategy:
    """torch FSDP2: ``fully_shard`` on every transformer block (the model's
    ``_no_split_modules``: decoder layers, vision blocks) and on the root, and a torch
    optimizer over the sharded parameters.

    LoRA works as it is (frozen and trained parameters may share a group). Parameters,
    gradients and optimizer states are sharded over the ranks; the checkpoint is
    ``torch.distributed.checkpoint`` under ``fsdp/`` (resumable at another world size),
    and the exported model is gathered to rank 0 (:meth:`full_state_dict`).
    """

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, device: torch.device) -> None:
        from torch.distributed.fsdp import fully_shard

        blocks = _block_names(model)
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module)
        fully_shard(model)
        self.model, self.optim_cfg, self.device = model, optim, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _optimizer(self.params, optim)

    def windows(self, loader: Any) -> Iterator[Window]:
        return fsdp.windows(self.model, loader, self.device)

    def micro_step(self, window: Any, batch: dict[str, Any], normalizer: float) -> torch.Tensor:
        return _forward_backward(self.model, window, batch, normalizer)

    def optimizer_step(self) -> None:
        _clip_and_step(self.params, self.optimizer, self.optim_cfg)

    def save(self, folder: Path, rank: int) -> None:
        from torch.distributed.checkpoint import save
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder / "fsdp")

    def load(self, folder: Path) -> None:
        from torch.distributed.checkpoint import load
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (folder / "fsdp" / ".metadata").is_file():
            raise FileNotFoundError(f"no FSDP checkpoint under {folder / 'fsdp'}")
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        load(state, checkpoint_id=folder / "fsdp")
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint import state_dict as dcp_state

        options = dcp_state.StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dcp_state.get_model_state_dict(self.model, options=options)


def _block_names(model: torch.nn.Module) -> set[str]:
    """Class names of the model's transformer blocks (HF's ``_no_split_modules``)."""
    names = {name for module in model.modules()
             for name in (getattr(module, "_no_split_modules", None) or [])}
    if not names:
        raise ValueError(f"{type(model).__name__} names no blocks (_no_split_modules) to "
                         "fully_shard; strategy.name=fsdp needs a Hugging Face model")
    return names


def _forward_backward(module: Any, window: Any, batch: dict[str, Any],
                      normalizer: float) -> torch.Tensor:
    """One micro-step under the loss contract (module docstring): the model returns
    ``sum(token losses) / normalizer``; backward through ``window``; the loss sum, detached."""
    out = module(**batch, num_items_in_batch=normalizer)
    window.backward(out.loss)
    return out.loss.detach() * normalizer


def make_strategy(model: torch.nn.Module, cfg: StrategyConfig, optim: OptimConfig, bf16: bool,
                  device: torch.device) -> Strategy:
    """The strategy ``cfg.name`` names, over the initialised default process group."""
    if cfg.name == "deepspeed":
        return DeepSpeedStrategy(model, cfg, optim, bf16)
    if cfg.name == "fsdp":
        return FSDPStrategy(model, optim, device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    return DDPStrategy(model, cfg, optim, world, device)
