"""SPEC 2.4 on real ranks: the loss normalizer makes DDP's gradient the exact global mean.

Every rank trains a tiny float64 causal "LM" wrapped in ``DistributedDataParallel`` on an
``odb.ODBLoader``: per micro-step it sums the token losses (causal shift, ignore index
-100) and divides by ``info.loss_normalizer``. After each gradient-accumulation window
the averaged gradient must equal, to 1e-12 relative, the gradient one plain process
computes over the union of all ranks' samples of that window, divided by the window's
loss-token count. The ranks run every case of their world size in one spawn (a
module-scoped fixture); the parent checks each case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import odb
from harness.ranks import run_ranks

pytestmark = pytest.mark.dist

VOCAB = 23
DIM = 6
IGNORE = -100
REL_TOL = 1e-12


class LMDataset:
    """Map-style dataset of causal-LM samples; ``masked`` samples carry no loss at all."""

    def __init__(self, lengths: list[int], masked: frozenset[int] = frozenset()) -> None:
        self.lengths = lengths
        self.masked = masked

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        n = self.lengths[index]
        ids = (torch.arange(n, dtype=torch.long) * 5 + 3 * index + 1) % VOCAB
        labels = ids.clone()
        if index in self.masked:
            labels[:] = IGNORE
        else:
            labels[: n // 3] = IGNORE  # a masked prompt
        return {"input_ids": ids, "labels": labels}


class TinyLM(nn.Module):
    """Causal by construction: position t sees the prefix sum of embeddings up to t."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids).cumsum(dim=1)
        return self.head(torch.tanh(self.mix(h)))


def make_model() -> TinyLM:
    torch.manual_seed(1234)
    return TinyLM().double()


def loss_sum(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


@dataclass(frozen=True)
class Case:
    name: str
    lengths: list[int]
    options: dict[str, Any]
    masked: frozenset[int] = frozenset()
    no_sync: bool = False  # DDP no_sync on every micro-step but the window's last
    expect_idle: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def dataset(self) -> LMDataset:
        return LMDataset(self.lengths, self.masked)


def _varied(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(v) for v in torch.randint(1, 30, (n,), generator=gen)]


_COMMON = dict(align_timeout_s=60.0, init_timeout_s=60.0, rendezvous_host="127.0.0.1",
               collate_mode="thread")

CASES: dict[int, list[Case]] = {
    2: [
        Case("w2_g1", _varied(40, 1), dict(_COMMON, token_budget=64, grad_accum_steps=1,
                                           queue_depth=3, buffer_budgets=2),
             masked=frozenset({0, 7, 13, 21})),
        # Every group is a singleton (length > budget / 2) and rank 0 has one sample more:
        # rank 1 must run IDLE steps, here inside windows of 2 without no_sync.
        Case("w2_g2_idle_uneven", [20, 25, 29, 18, 30, 22, 27, 3, 40], dict(
            _COMMON, token_budget=32, grad_accum_steps=2, shuffle=False, queue_depth=2),
             masked=frozenset({3}), expect_idle=True),
        # Every label masked on every rank: zero gradient, normalizer 1 / W, no NaN.
        Case("w2_g2_all_masked", _varied(11, 2), dict(_COMMON, token_budget=48,
                                                      grad_accum_steps=2),
             masked=frozenset(range(11))),
        Case("w2_g2_process", _varied(30, 3), dict(_COMMON, token_budget=48, grad_accum_steps=2,
                                                   collate_mode="process", policy="paper",
                                                   queue_depth=2),
             masked=frozenset({4, 5})),
    ],
    3: [
        Case("w3_g3_no_sync", _varied(50, 4), dict(_COMMON, token_budget=40, grad_accum_steps=3,
                                                   queue_depth=4, buffer_budgets=3),
             masked=frozenset({1, 2, 30}), no_sync=True),
        # More ranks than samples: rank 2 reads nothing and runs only IDLE steps.
        Case("w3_g1_more_ranks_than_samples", [9, 14], dict(_COMMON, token_budget=16,
                                                             grad_accum_steps=1),
             expect_idle=True),
        # Rank 0 holds two long singletons, rank 2 a single short sample: IDLE on rank 2.
        Case("w3_g2_idle_long_sample", [60, 4, 5, 61, 3], dict(
            _COMMON, token_budget=64, grad_accum_steps=2, shuffle=False, policy="paper"),
             masked=frozenset({4}), no_sync=True, expect_idle=True),
    ],
}


def _train_window(ddp: DistributedDataParallel, window: list[tuple[dict, odb.StepInfo]],
                  no_sync: bool) -> dict[str, Any]:
    normalizers = {info.loss_normalizer for _, info in window}
    assert len(normalizers) == 1, f"micro-steps of one window disagree: {normalizers}"
    records = []
    for k, (batch, info) in enumerate(window):
        labels = batch["labels"]
        assert info.local_loss_tokens == int((labels[:, 1:] != IGNORE).sum())
        if info.idle:
            assert info.sample_ids == () and labels.shape[0] == 1
            assert bool((labels == IGNORE).all()), "IDLE batch with unmasked labels"
        last = k == len(window) - 1
        loss = loss_sum(ddp, batch["input_ids"], labels)
        if info.idle:
            assert loss.item() == 0.0
        scaled = loss / info.loss_normalizer
        if no_sync and not last:
            with ddp.no_sync():
                scaled.backward()
        else:
            scaled.backward()
        records.append(dict(ids=list(info.sample_ids), idle=info.idle, step=info.step,
                            normalizer=info.loss_normalizer,
                            window_tokens=info.accumulation_loss_tokens,
                            global_tokens=info.global_loss_tokens,
                            local_tokens=info.local_loss_tokens))
    grads = {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
             for name, p in ddp.module.named_parameters()}
    ddp.zero_grad(set_to_none=True)
    return dict(steps=records, grads=grads)


def _run_case(case: Case, world_size: int) -> list[dict[str, Any]]:
    model = make_model()
    ddp = DistributedDataParallel(model)
    loader = odb.ODBLoader(case.dataset(), **case.options)
    accum = case.options["grad_accum_steps"]
    windows, pending = [], []
    for batch in loader:
        info = odb.pop_step_info(batch)
        assert info.world_size == world_size
        if pending and info.step // accum != pending[0][1].step // accum:
            windows.append(_train_window(ddp, pending, case.no_sync))
            pending = []
        pending.append((batch, info))
    if pending:
        windows.append(_train_window(ddp, pending, case.no_sync))
    return windows


def _run_cases(rank: int, world_size: int) -> dict[str, list[dict[str, Any]]]:
    return {case.name: _run_case(case, world_size) for case in CASES[world_size]}


@pytest.fixture(scope="module")
def rank_results() -> dict[int, list[dict[str, list[dict[str, Any]]]]]:
    return {w: run_ranks(_run_cases, w, timeout=150) for w in CASES}


def _reference(case: Case, ids: list[int]) -> tuple[dict[str, torch.Tensor], int]:
    """Gradient of (sum of token losses over ``ids``) / (their loss tokens), one process."""
    model = make_model()
    data = case.dataset()
    tokens = 0
    total = torch.zeros((), dtype=torch.float64)
    for i in ids:
        sample = data[i]
        labels = sample["labels"][None]
        tokens += int((labels[:, 1:] != IGNORE).sum())
        total = total + loss_sum(model, sample["input_ids"][None], labels)
    if ids:
        (total / max(tokens, 1)).backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p))
             for name, p in model.named_parameters()}
    return grads, tokens


def _assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, where: str) -> None:
    assert torch.isfinite(got).all(), f"{where} {name}: non-finite gradient"
    ref_norm = ref.norm().item()
    if ref_norm == 0.0:
        assert bool((got == 0).all()), f"{where} {name}: expected zero gradient, got {got}"
        return
    err = (got - ref).norm().item()
    assert err <= REL_TOL * ref_norm, f"{where} {name}: relative error {err / ref_norm:.3e}"


ALL_CASES = [(w, case) for w, cases in CASES.items() for case in cases]


@pytest.mark.parametrize(("world_size", "case"), ALL_CASES, ids=[c.name for _, c in ALL_CASES])
def test_exact_window_gradient(rank_results: dict, world_size: int, case: Case) -> None:
    per_rank = [r[case.name] for r in rank_results[world_size]]
    counts = [len(windows) for windows in per_rank]
    assert len(set(counts)) == 1, f"ranks saw different window counts: {counts}"
    accum = case.options["grad_accum_steps"]
    seen: list[int] = []
    idle_steps = 0
    for k in range(counts[0]):
        where = f"{case.name} window {k}"
        windows = [windows[k] for windows in per_rank]
        steps = [w["steps"] for w in windows]
        assert len({len(s) for s in steps}) == 1
        assert all(len(s) <= accum for s in steps)
        assert len({s[0]["step"] // accum for s in steps}) == 1, f"{where}: misaligned windows"
        union = [i for s in steps for step in s for i in step["ids"]]
        idle_steps += sum(step["idle"] for s in steps for step in s)
        seen.extend(union)
        ref, tokens = _reference(case, union)
        for s in steps:
            for step in s:
                assert step["window_tokens"] == tokens, f"{where}: window tokens"
                assert step["normalizer"] == max(tokens, 1) / world_size, f"{where}: normalizer"
        for j in range(len(steps[0])):
            assert steps[0][j]["global_tokens"] == sum(s[j]["local_tokens"] for s in steps)
        for rank, window in enumerate(windows):
            for name, ref_grad in ref.items():
                _assert_close(name, window["grads"][name], ref_grad, f"{where} rank {rank}")
    assert sorted(seen) == list(range(len(case.lengths))), "a sample was lost or duplicated"
    if case.expect_idle:
        assert idle_steps > 0, f"{case.name}: the setup was meant to produce IDLE steps"
    if case.masked == frozenset(range(len(case.lengths))):
        assert all(step["normalizer"] == 1 / world_size
                   for windows in per_rank for w in windows for step in w["steps"])
