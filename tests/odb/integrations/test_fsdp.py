"""``odb.integrations.fsdp`` on real Gloo ranks with torch's ``fully_shard`` (FSDP2) on CPU:
every window of an epoch (grad accumulation 1 and 3, a short last window, IDLE steps,
HSDP, a user divide factor, bf16 mixed precision with CPU offload, W=2 and W=3) reduces
once, on its last micro-step, and its gradient is one process's gradient of the per-token
mean over all ranks' samples of the window (fp64 model, ``TOLERANCE``; bf16:
``BF16_TOLERANCE``); what the helper cannot drive is refused by name; and what
``odb/integrations/_fsdp_state.py`` reads of torch's private FSDP state is there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import odb
from harness.ranks import run_ranks
from odb.integrations import fsdp
from odb.integrations._fsdp_state import GroupReduction, group_reductions
from tests.odb.integrations.tiny import TokenDataset, reference_grads, tiny_model

pytestmark = [pytest.mark.dist]
DATA = (20, 8, 60)  # samples, shortest, longest
# Relative error of a gradient, in fp64. Not 1e-15: HF's rotary embedding runs in fp32
# whatever the model's dtype, and a padded batch rounds it differently from the
# reference's one-sample batches (DDP at W=3 shows the same 1.3e-7).
TOLERANCE = 1e-6
# With bf16 parameters the forward and backward round to 8 bits of mantissa (measured: up
# to 4e-2); a wrong weight (a factor of W, or of the divide factor) is off by 33% or more.
BF16_TOLERANCE = 0.1


@dataclass(frozen=True)
class Case:
    """One epoch's set-up; ``short``/``idle``: the data gives a short last window / IDLE steps."""

    world_size: int
    accum: int
    factor: float | None = None  # set_gradient_divide_factor on every fully_shard module
    data: tuple[int, int, int] = DATA
    budget: int = 96
    hsdp: bool = False  # a (W, 1) mesh: replicate over W, shard over 1
    bf16: bool = False  # fp32 model, MixedPrecisionPolicy(bf16 params, fp32 reduce)
    offload: bool = False  # CPUOffloadPolicy
    short: bool = False
    idle: bool = False


CASES = {
    "W2-accum1-idle": Case(2, 1, budget=64, idle=True),
    "W2-accum3-short-factor1": Case(2, 3, factor=1.0, short=True),
    "W2-accum3-short-hsdp": Case(2, 3, hsdp=True, short=True),
    "W3-accum3-short": Case(3, 3, short=True),
    "W3-accum1-idle-factor2": Case(3, 1, factor=2.0, data=(7, 8, 60), idle=True),
    "W2-accum3-short-bf16-offload": Case(2, 3, short=True, bf16=True, offload=True),
}


def _sharded(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _hsdp_mesh(world_size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("replicate", "shard"))


def _policies(case: Case) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    found: dict[str, Any] = {"mesh": _hsdp_mesh(case.world_size)} if case.hsdp else {}
    if case.bf16:
        found["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, reduce_dtype=torch.float32)
    if case.offload:
        found["offload_policy"] = CPUOffloadPolicy(pin_memory=False)  # no accelerator to pin for
    return found


def _epoch_grads(rank: int, world_size: int, case: Case) -> list[dict[str, Any]]:
    """Every window of one epoch, no optimizer step: its ids, its micro-steps' sync state
    and (rank 0) the full reduced gradient."""
    model = _sharded(tiny_model() if case.bf16 else tiny_model().double(), **_policies(case))
    for module in _fsdp_modules(model) if case.factor is not None else ():
        module.set_gradient_divide_factor(case.factor)
    loader = odb.ODBLoader(TokenDataset(*case.data), token_budget=case.budget,
                           grad_accum_steps=case.accum, collate_mode="thread", seed=1)  # fmt: skip
    loader.set_epoch(0)
    first = next(model.parameters())
    windows = []
    for window in fsdp.windows(model, loader):
        synced = []
        for batch, info in window:
            window.backward(model(**batch, num_items_in_batch=info.loss_normalizer).loss)
            synced.append(first.grad is not None)  # the sharded grad exists once reduced
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        model.zero_grad()
        windows.append({"ids": [i for info in window.infos for i in info.sample_ids],
                        "synced": synced, "idle": window.idle_steps,
                        "grads": grads if rank == 0 else None})  # fmt: skip
    return windows


@pytest.mark.parametrize("name", list(CASES))
def test_every_window_reduces_once_to_the_global_per_token_mean(name: str) -> None:
    case = CASES[name]
    ranks = run_ranks(_epoch_grads, case.world_size, case, timeout=240)
    assert len({len(windows) for windows in ranks}) == 1  # every rank runs the same windows
    last = len(ranks[0][-1]["synced"])
    assert last < case.accum if case.short else last == case.accum, "the data changed"
    assert any(w["idle"] for windows in ranks for w in windows) == case.idle, "the data changed"
    dataset, model = TokenDataset(*case.data), tiny_model().double()
    ids = []
    for step, rank0 in enumerate(ranks[0]):
        # Reduced once, on the window's last micro-step, whatever the window's length.
        assert rank0["synced"] == [False] * (len(rank0["synced"]) - 1) + [True]
        window_ids = [i for windows in ranks for i in windows[step]["ids"]]
        ids += window_ids
        reference = reference_grads(model, [dataset[i] for i in window_ids])
        for param, grad in reference.items():
            error = torch.linalg.norm(rank0["grads"][param].double() - grad) / grad.norm()
            assert error < (BF16_TOLERANCE if case.bf16 else TOLERANCE), (step, param, error)
    assert sorted(ids) == list(range(case.data[0]))  # every sample once, none twice


def _refusals(rank: int, world_size: int) -> list[str]:
    from torch.distributed.fsdp import fully_shard

    found = []
    plain = tiny_model()
    for model, change in [
        (plain, None),
        (_sharded(tiny_model()), lambda m: m.set_gradient_divide_factor(1.0)),  # root only
        (_sharded(tiny_model()), lambda m: m.set_all_reduce_hook(lambda grad: None)),
    ]:
        if change is not None:
            change(model)
        try:
            fsdp.gradient_divisor(model)
        except ValueError as error:
            found.append(str(error))
    partial = tiny_model()
    fully_shard(partial.model.layers[0])  # the rest of the model is not sharded
    try:
        fsdp.gradient_divisor(partial)
    except ValueError as error:
        found.append(str(error))
    # Every parameter in a sharded block, the root itself no fully_shard module.
    unsharded_root = torch.nn.Sequential(_sharded(tiny_model()))
    try:
        loader = odb.ODBLoader(TokenDataset(*DATA), token_budget=96, collate_mode="thread")
        fsdp.windows(unsharded_root, loader)
    except ValueError as error:
        found.append(str(error))
    return found + [_tensor_parallel_refusal(world_size)]


def _tensor_parallel_refusal(world_size: int) -> str:
    """A model sharded over a mesh dimension of size 1 beside a second one (as if for
    tensor parallelism): its data-parallel size is 1, the loader's W is 2."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("other", "dp"))
    model = _sharded(tiny_model(), mesh=mesh["dp"])
    loader = odb.ODBLoader(TokenDataset(*DATA), token_budget=96, collate_mode="thread")
    loader.set_epoch(0)
    windows = fsdp.windows(model, loader)
    try:
        next(windows)
    except ValueError as error:
        return str(error)
    finally:
        windows.close()
    return "not refused"


def test_what_it_cannot_drive_is_refused_by_name() -> None:
    found = run_ranks(_refusals, 2, timeout=120)[0]
    assert len(found) == 6, found
    assert "no fully_shard state" in found[0]
    assert "set_gradient_divide_factor on every fully_shard module" in found[1]
    assert "set_all_reduce_hook" in found[2]
    assert "outside every fully_shard group" in found[3]
    assert "Sequential is no fully_shard module" in found[4]
    assert "data-parallel size is 1 but the loader runs on 2 ranks" in found[5]


def _reductions(rank: int, world_size: int) -> list[list[GroupReduction]]:
    plain = _sharded(tiny_model())
    hsdp = _sharded(tiny_model(), mesh=_hsdp_mesh(world_size))
    for module in _fsdp_modules(hsdp):
        module.set_gradient_divide_factor(4.0)
    return [group_reductions(plain), group_reductions(hsdp), [fsdp.gradient_divisor(hsdp)]]


def test_the_private_fsdp_state_it_reads_is_still_there() -> None:
    """Fails when torch moves what ``odb/integrations/_fsdp_state.py`` reads (torch 2.13)."""
    plain, hsdp, [divisor] = run_ranks(_reductions, 2, timeout=120)[0]
    layers = 2 + 1  # the two decoder layers, then the root's own parameters
    assert plain == [GroupReduction(2, 1, None, False)] * layers
    assert [r.divisor for r in plain] == [2.0] * layers
    assert hsdp == [GroupReduction(1, 2, 4.0, False)] * layers
    assert divisor == (2, 4.0)


def _full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optimizer": optim_state.get("state", {})}  # empty off rank 0


def _save_or_load(rank: int, world_size: int, folder: str, save: bool) -> dict[str, Any]:
    """Save after one AdamW window (W=2), or load into a fresh model and optimizer."""
    model = _sharded(tiny_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = odb.ODBLoader(TokenDataset(*DATA), token_budget=96, grad_accum_steps=3,
                           collate_mode="thread", seed=1)  # fmt: skip
    if not save:
        epoch = fsdp.load_checkpoint(folder, model, optimizer, loader)
        return {"epoch": epoch, "state": _full_state(model, optimizer)}
    loader.set_epoch(0)
    windows = fsdp.windows(model, loader)
    for batch, info in next(windows):
        model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    fsdp.save_checkpoint(folder, model, optimizer, loader)
    windows.close()
    return {"state": _full_state(model, optimizer)}


def test_a_checkpoint_loads_resharded_at_another_world_size(tmp_path: Path) -> None:
    """Saved at W=2, loaded at W=3: the same full model and AdamW state, the saved epoch;
    a folder without DCP's metadata (a save killed half-way) is refused by name."""
    folder = str(tmp_path / "ckpt")
    saved = run_ranks(_save_or_load, 2, folder, True, timeout=120)[0]["state"]
    loaded = run_ranks(_save_or_load, 3, folder, False, timeout=120)
    assert [r["epoch"] for r in loaded] == [0, 0, 0]
    for name, value in saved["model"].items():
        assert torch.equal(loaded[0]["state"]["model"][name], value), name
    moments = loaded[0]["state"]["optimizer"]
    assert saved["optimizer"] and saved["optimizer"].keys() == moments.keys()
    for name, saved_moments in saved["optimizer"].items():
        for key, value in saved_moments.items():
            assert torch.equal(moments[name][key], value), (name, key)
    (tmp_path / "ckpt" / "model" / ".metadata").unlink()
    with pytest.raises(AssertionError, match="no complete checkpoint"):
        run_ranks(_save_or_load, 2, folder, False, timeout=120)
