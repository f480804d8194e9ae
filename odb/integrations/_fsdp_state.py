"""The one place odb reads FSDP2's private state: how each parameter group's gradients are reduced.

``fully_shard`` divides every reduced gradient by the divide factor a user set
(``FSDPModule.set_gradient_divide_factor``, which sets it on that module's own parameter
group only), or else by the data-parallel size: the shard group's size times, under
HSDP, the replicate group's. Torch has setters for these but no getters, and
:mod:`odb.integrations.fsdp` must know the divisor to keep the loss exact, and must know
that no user hook (``set_all_reduce_hook``) reduces over a group it cannot see.

Tracks torch 2.13 (``torch/distributed/fsdp/_fully_shard/``: ``FSDPModule._get_fsdp_state``,
``FSDPState._fsdp_param_groups``; on each ``FSDPParamGroup`` its ``fsdp_params`` (their
``sharded_param``), ``mesh_info`` (``shard_mesh_size``, ``replicate_mesh_size``),
``gradient_divide_factor`` and ``_all_reduce_hook``; ``_fsdp_collectives.
_get_gradient_divide_factors`` applies them). ``tests/odb/integrations/test_fsdp.py``
fails when that changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GroupReduction", "group_reductions", "managed_parameters"]


@dataclass(frozen=True)
class GroupReduction:
    """How one FSDP parameter group's gradients are reduced.

    Attributes:
        shard_size: Ranks the gradients are reduce-scattered over (1 without sharding).
        replicate_size: Ranks they are then all-reduced over (HSDP; 1 otherwise).
        divide_factor: The user's divide factor; None for the default (the product of
            the two sizes).
        all_reduce_hook: Whether a user hook runs on the reduced gradients.
    """

    shard_size: int
    replicate_size: int
    divide_factor: float | None
    all_reduce_hook: bool

    @property
    def divisor(self) -> float:
        """What every reduced gradient of the group is divided by."""
        if self.divide_factor is not None:
            return float(self.divide_factor)
        return float(self.shard_size * self.replicate_size)


def _param_groups(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            groups += module._get_fsdp_state()._fsdp_param_groups
    return groups


def group_reductions(model: torch.nn.Module) -> list[GroupReduction]:
    """One :class:`GroupReduction` per FSDP parameter group of ``model`` (empty: none)."""
    return [
        GroupReduction(
            shard_size=getattr(group.mesh_info, "shard_mesh_size", 1),
            replicate_size=getattr(group.mesh_info, "replicate_mesh_size", 1),
            divide_factor=group.gradient_divide_factor,
            all_reduce_hook=group._all_reduce_hook is not None,
        )
        for group in _param_groups(model)
    ]


def managed_parameters(model: torch.nn.Module) -> set[int]:
    """``id`` of every parameter of ``model`` whose gradient FSDP reduces."""
    return {
        id(param.sharded_param) for group in _param_groups(model) for param in group.fsdp_params
    }
