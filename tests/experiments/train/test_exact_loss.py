"""Through the real entry point at W=2, the first optimizer step's gradient equals one
process's gradient of the per-token mean loss over the same samples (SPEC 2.4), under
DDP and under FSDP2 (``strategy.name=fsdp``: sharded gradients, gathered to export);
under FSDP2 also at W=3 with accumulation 1 and 3 (a short last window).

Three samples over two ranks with one sample per step and grad_accum_steps=2: one rank
runs two real micro-steps, the other one real step and one IDLE step, in the same
window. Plain SGD with lr=1 and no clipping makes the update the gradient itself:
``grad = theta_0 - theta_1``, read from the saved final model.
"""

import json
from pathlib import Path

import pytest
import torch

from experiments.data.pipeline import collate
from experiments.train.model import set_trainable
from tests.experiments.train.conftest import train

pytestmark = [pytest.mark.dist, pytest.mark.slow]

EXACT = ("data.max_samples=3", "data.holdout_samples=0", "optim.grad_accum_steps=2",
         "optim.optimizer=sgd", "optim.lr=1.0", "optim.schedule=constant",
         "optim.warmup_ratio=0.0", "optim.max_grad_norm=0.0", "optim.max_steps=1",
         "run.record_sample_ids=true", "method.token_budget=1024")


def _load(path: Path):
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)


def _first_window(out: Path, world: int = 2, accum: int = 2) -> tuple[list[int], int]:
    ids, idle = [], 0
    for rank in range(world):
        for line in (out / f"samples_rank{rank}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert row["step"] <= accum, "max_steps=1: at most one window per rank"
            ids += row["ids"]
            idle += row["idle"]
    return sorted(ids), idle


def _assert_update_is_the_reference(tiny_model_dir: Path, out: Path, samples: list[dict],
                                    pad_id: int) -> None:
    """``theta_0 - theta_1`` (SGD, lr 1) equals one process's per-token-mean gradient."""
    reference = _reference_grads(tiny_model_dir, samples, pad_id)
    before = dict(_load(tiny_model_dir).named_parameters())
    after = dict(_load(out / "final" / "model").named_parameters())
    diff = torch.cat([(before[n] - after[n]).flatten() for n in reference]).double()
    ref = torch.cat([g.flatten() for g in reference.values()]).double()
    assert torch.linalg.norm(diff - ref) / torch.linalg.norm(ref) < 1e-5
    frozen = [n for n in before if n not in reference]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)


def _reference_grads(model_dir: Path, samples: list[dict], pad_id: int) -> dict:
    model = _load(model_dir)
    set_trainable(model, train_vision=False)
    tokens = sum(int((s["labels"][1:] != -100).sum()) for s in samples)
    for sample in samples:  # one process, the per-token mean over the union
        model(**collate([sample], pad_id), num_items_in_batch=tokens).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("method", "strategy"),
                         [("odb", "ddp"), ("standard", "ddp"), ("odb", "fsdp")])
def test_first_step_gradient_is_the_global_per_token_mean(
        method: str, strategy: str, base_config: Path, tiny_model_dir: Path, ultrachat_train,
        tmp_path: Path
) -> None:
    lengths = [ultrachat_train.length(i) for i in range(3)]
    assert min(lengths) + max(lengths) > 1024, "premise: every group is a single sample"
    extra = ("method.baseline.batch_size=1",) if method == "standard" else ()
    extra += (f"strategy.name={strategy}",)
    result = train(base_config, tmp_path, f"method/{method}.yaml", overrides=EXACT + extra)
    assert (result["steps"], result["idle_steps"], result["emitted_samples"]) == (2, 1, 3)
    ids, idle = _first_window(tmp_path)
    assert (ids, idle) == ([0, 1, 2], 1)

    _assert_update_is_the_reference(tiny_model_dir, tmp_path, [ultrachat_train[i] for i in ids],
                                    ultrachat_train.tokenizer.pad_token_id)


@pytest.mark.parametrize("accum", [1, 3])
def test_fsdp_at_three_ranks_steps_on_the_global_per_token_mean(
        accum: int, base_config: Path, tiny_model_dir: Path, ultrachat_train, tmp_path: Path
) -> None:
    """W=3 under FSDP2, one sample per rank: with accumulation 1 the window is one
    micro-step; with 3 it is the epoch's last window, short (one micro-step of three)."""
    overrides = tuple(o for o in EXACT if not o.startswith("optim.grad_accum_steps"))
    overrides += (f"optim.grad_accum_steps={accum}", "strategy.name=fsdp")
    result = train(base_config, tmp_path, "method/odb.yaml", overrides=overrides, world=3)
    assert (result["steps"], result["idle_steps"], result["emitted_samples"]) == (1, 0, 3)
    ids, idle = _first_window(tmp_path, world=3, accum=accum)
    assert (ids, idle) == ([0, 1, 2], 0)
    _assert_update_is_the_reference(tiny_model_dir, tmp_path, [ultrachat_train[i] for i in ids],
                                    ultrachat_train.tokenizer.pad_token_id)
