"""``odb.integrations.ddp`` on 2 Gloo ranks with a real ``DistributedDataParallel``: the
window holds the all-reduce until its last micro-step, and the window's gradient is one
process's gradient of the per-token mean over both ranks' samples."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import odb
from harness.ranks import run_ranks
from odb.integrations import ddp
from tests.odb.integrations.tiny import TokenDataset, reference_grads, tiny_model

pytestmark = [pytest.mark.dist]
DATA = (24, 8, 60)  # samples, shortest, longest


def _first_window(rank: int, world_size: int) -> dict[str, Any]:
    model = tiny_model()
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    loader = odb.ODBLoader(TokenDataset(*DATA), token_budget=96, grad_accum_steps=3,
                           collate_mode="thread", seed=1)
    loader.set_epoch(0)
    windows = ddp.windows(wrapped, loader)
    window = next(windows)
    syncs = []
    for batch, info in window:
        syncs.append(wrapped.require_backward_grad_sync)
        window.backward(wrapped(**batch, num_items_in_batch=info.loss_normalizer).loss)
    windows.close()  # leaves the epoch: the loader's collate side stops
    return {"ids": [i for info in window.infos for i in info.sample_ids], "syncs": syncs,
            "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


def test_a_window_syncs_once_and_its_gradient_is_the_global_per_token_mean() -> None:
    ranks = run_ranks(_first_window, 2, timeout=120)
    for r in ranks:
        assert len(r["syncs"]) == 3
        assert r["syncs"] == [False, False, True]  # no_sync but on the boundary
    dataset = TokenDataset(*DATA)
    ids = ranks[0]["ids"] + ranks[1]["ids"]
    reference = reference_grads(tiny_model(), [dataset[i] for i in ids])
    for name, grad in reference.items():
        for r in ranks:  # after the all-reduce, every rank holds the same average
            assert torch.allclose(r["grads"][name], grad, rtol=1e-4, atol=1e-7), name
