"""Two engines behind one small interface: plain DDP and DeepSpeed ZeRO.

The loop hands each engine micro-steps and says which one closes the accumulation
window; the engine owns forward, backward, gradient sync and the optimizer. The loss
contract is the same for both (SPEC 2.4): the model returns
``sum(token losses) / info.loss_normalizer`` (HF's ``num_items_in_batch``), and the
engines' gradient averaging over ``W`` ranks turns that into the gradient of the global
per-token mean over the window. So neither engine may rescale again: DDP's
``no_sync`` accumulation adds micro-step gradients as they are, and DeepSpeed's
backward is called with ``scale_wrt_gas=False`` (it would otherwise divide by the
accumulation steps a second time). Window boundaries are set explicitly on DeepSpeed
too, because a dynamic-batching epoch may end with a partial window.

An IDLE step is an ordinary micro-step here: its labels are all masked, so its loss is
an exact zero with a graph, and backward fires every gradient hook (DDP all-reduce,
ZeRO reduce-scatter) like a real step.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from experiments.train.config import EngineConfig, OptimConfig

__all__ = ["DDPEngine", "DeepSpeedEngine", "Engine", "make_engine"]


class Engine(Protocol):
    """What the train loop needs from an engine."""

    model: torch.nn.Module  # the unwrapped model (save, evaluate)
    optimizer: torch.optim.Optimizer  # whose param groups the schedule sets

    def micro_step(self, batch: dict[str, Any], normalizer: float, boundary: bool
                   ) -> torch.Tensor:
        """Forward + backward of one micro-batch; returns its loss sum (detached)."""
        ...

    def optimizer_step(self) -> None:
        """Apply the window's gradients (after the boundary micro-step)."""
        ...

    def save(self, folder: Path, rank: int) -> None: ...
    def load(self, folder: Path) -> None: ...


def _optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("no trainable parameters: check mode, lora.target_modules and "
                         "model.train_vision")
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def _loss_sum(out: Any, normalizer: float) -> torch.Tensor:
    return out.loss.detach() * normalizer


class DDPEngine:
    """``DistributedDataParallel`` (or the bare model at one rank) and a torch optimizer."""

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, optim: OptimConfig,
                 world_size: int) -> None:
        self.model = model
        self.optim_cfg = optim
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _optimizer(self.params, optim)
        self.wrapped: torch.nn.Module = model
        if world_size > 1:
            # A text-only batch leaves a trainable vision tower without gradients.
            vision_trains = any(p.requires_grad for n, p in model.named_parameters()
                                if ".visual." in f".{n}")
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                model, find_unused_parameters=cfg.find_unused_parameters or vision_trains)

    def micro_step(self, batch: dict[str, Any], normalizer: float, boundary: bool
                   ) -> torch.Tensor:
        sync = boundary or not isinstance(self.wrapped, torch.nn.parallel.DistributedDataParallel)
        with contextlib.nullcontext() if sync else self.wrapped.no_sync():
            out = self.wrapped(**batch, num_items_in_batch=normalizer)
            out.loss.backward()
        return _loss_sum(out, normalizer)

    def optimizer_step(self) -> None:
        if self.optim_cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.optim_cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, folder: Path, rank: int) -> None:
        if rank == 0:  # optimizer state is replicated under DDP
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        state = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state)


class DeepSpeedEngine:
    """A DeepSpeed engine (ZeRO stage 0-2) around the model and a torch optimizer.

    Gradient clipping and bf16 master weights are DeepSpeed's. Its checkpoint (model and
    partitioned optimizer states) is written collectively under ``deepspeed/``.
    """

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, optim: OptimConfig,
                 bf16: bool) -> None:
        import deepspeed

        _skip_cpu_shm_comm_build(deepspeed)
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
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
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=_optimizer(params, optim),
            config=config)

    def micro_step(self, batch: dict[str, Any], normalizer: float, boundary: bool
                   ) -> torch.Tensor:
        self.engine.set_gradient_accumulation_boundary(boundary)
        out = self.engine(**batch, num_items_in_batch=normalizer)
        self.engine.backward(out.loss, scale_wrt_gas=False)
        if not boundary:
            self.engine.step()  # a no-op off the boundary; keeps DeepSpeed's counters
        return _loss_sum(out, normalizer)

    def optimizer_step(self) -> None:
        self.engine.step()

    def save(self, folder: Path, rank: int) -> None:
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state")

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder / "deepspeed"), tag="state",
                                              load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {folder / 'deepspeed'}")


def _skip_cpu_shm_comm_build(deepspeed: Any) -> None:
    """Keep DeepSpeed's CPU accelerator from JIT-compiling its shared-memory all-reduce.

    Its comm backend builds the ``deepspeed_shm_comm`` extension when it starts, unless
    the op is marked incompatible: about 55 s of a C++ compile on 2 cores, paid on every
    fresh machine (and again whenever another environment's build replaced the cached
    one). Only DeepSpeed's inference all-reduce (tensor-parallel inference) uses it;
    ZeRO training's collectives go through ``torch.distributed`` either way. Not
    touched on other accelerators, where the op does not exist.
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def make_engine(model: torch.nn.Module, cfg: EngineConfig, optim: OptimConfig,
                bf16: bool) -> Engine:
    """The engine ``cfg.name`` names, over the initialised default process group."""
    if cfg.name == "deepspeed":
        return DeepSpeedEngine(model, cfg, optim, bf16)
    world = dist.get_world_size() if dist.is_initialized() else 1
    return DDPEngine(model, cfg, optim, world)
