"""Validation loss: per-token mean cross-entropy over a held-out split, batched the same
way for every training method.

The number must not depend on how a method batches its training data, so the batching
here is fixed and method-independent: the held-out samples are sorted by length (ties by
index) and cut into consecutive groups whose padded cost ``max_len * n`` stays within
``token_budget`` (a longer sample is scored alone), collated by the pipeline's own
``collate``. Right padding with an attention mask leaves each sample's logits unchanged,
and the loss is a sum of per-token terms divided by the global token count, so any
batching gives the same value up to float rounding; `plan_batches` only decides speed
and memory.

On N ranks (``torch.distributed`` initialised) rank ``r`` scores the strided shard
``r, r + N, ...`` of the held-out split and the three sums (loss, tokens, samples) are
all-reduced, so every rank returns the same numbers.

The one home of the number: the train loop's validation calls it, and so does the
``evaluate`` rule's evaluator (``python -m eval.val_loss``, which loads a checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from experiments.data.pipeline import IGNORE_INDEX, collate
from experiments.data.pixels import decode_batch

# Inputs the model takes; labels stay out so the loss is computed here, in float64 sums.
_MODEL_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")


def plan_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Length-sorted groups of indices whose padded cost ``max_len * n`` fits the budget.

    Pure and deterministic: the same lengths always give the same groups. A sample longer
    than the budget forms a group of its own (it is scored, never dropped).

    Example:
        >>> plan_batches([5, 3, 9, 3], token_budget=10)
        [[1, 3], [0], [2]]
    """
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget must be a positive int, got {token_budget!r}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted ascending, so lengths[i] is the group's max once i joins
        if current and lengths[i] * (len(current) + 1) > token_budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def _length(dataset, index: int) -> int:
    if hasattr(dataset, "length"):
        return int(dataset.length(index))
    return len(dataset[index]["input_ids"])


def token_loss_sum(model, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(sum of next-token cross-entropy, number of scored tokens) of one padded batch.

    Labels are shifted by one (position t predicts token t+1); ``-100`` carries no loss.
    The sum is accumulated in float64 so batching changes it only by float32 logit noise.
    """
    inputs = {k: v for k, v in batch.items() if k in _MODEL_KEYS}
    logits = model(**inputs).logits[:, :-1].float()
    labels = batch["labels"][:, 1:].to(logits.device)
    mask = labels != IGNORE_INDEX
    if not mask.any():
        return 0.0, 0
    logprobs = torch.log_softmax(logits[mask], dim=-1)
    picked = logprobs.gather(-1, labels[mask][:, None]).squeeze(-1)
    return float(-picked.double().sum()), int(mask.sum())


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def validation_loss(
    model,
    dataset,
    *,
    token_budget: int,
    pad_token_id: int,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> dict:
    """Per-token mean validation loss of ``model`` on ``dataset`` (all ranks agree).

    Args:
        model: a loaded model (plain, or peft-wrapped; not DDP-wrapped) taking the
            sample fields as keyword arguments and returning ``.logits``.
        dataset: map-style dataset of samples with ``input_ids`` and ``labels`` (and
            optionally ``attention_mask``, ``mm_token_type_ids``, ``pixel_values``,
            ``image_grid_thw``), e.g. `PreprocessedDataset` with ``holdout=True``.
            ``dataset.length(i)`` is used for planning when present.
        token_budget: padded tokens per forward pass (speed and memory only).
        pad_token_id: id written into padded positions.
        device: where batches go; default: the device of the model's parameters.
        progress: show a tqdm bar on rank 0.

    Returns:
        ``{"loss", "tokens", "samples", "batches", "token_budget", "world_size"}``; loss
        is the sum of token cross-entropies divided by ``tokens`` (NaN when no sample
        has a label); ``batches`` counts forward passes over all ranks.

    Example:
        >>> out = validation_loss(model, heldout, token_budget=4096,
        ...                       pad_token_id=tok.pad_token_id)  # doctest: +SKIP
        >>> sorted(out)[:3]  # doctest: +SKIP
        ['batches', 'loss', 'samples']
    """
    rank, world = _rank_world()
    if device is None:
        device = next(model.parameters()).device
    batches = _shard_batches(dataset, token_budget, rank, world)
    loss_sum, tokens = _loss_sums(
        model, dataset, batches, pad_token_id, device, progress=progress and rank == 0
    )
    totals = [loss_sum, tokens, sum(len(b) for b in batches), len(batches)]
    loss_sum, n_tokens, n_samples, n_batches = _sum_over_ranks(totals, device, world)
    return {
        "loss": loss_sum / n_tokens if n_tokens else float("nan"),
        "tokens": int(n_tokens),
        "samples": int(n_samples),
        "batches": int(n_batches),
        "token_budget": token_budget,
        "world_size": world,
    }


def _shard_batches(dataset, token_budget: int, rank: int, world: int) -> list[list[int]]:
    """This rank's batches: dataset indices of the strided shard ``rank, rank + world,
    ...``, cut by `plan_batches`; every index of the shard is in exactly one batch."""
    shard = list(range(rank, len(dataset), world))
    groups = plan_batches([_length(dataset, i) for i in shard], token_budget)
    return [[shard[j] for j in group] for group in groups]


@torch.no_grad()
def _loss_sums(
    model, dataset, batches: list[list[int]], pad_token_id: int, device, progress: bool
) -> tuple[float, int]:
    """(sum of token cross-entropies, scored tokens) over ``batches`` of ``dataset``.

    The model runs in eval mode and gets its training mode back afterwards, also when a
    forward pass raises. uint8 pixels (``dataset.pixel_codec``) are decoded on ``device``.
    """
    from tqdm.auto import tqdm

    codec = getattr(dataset, "pixel_codec", None)
    was_training = model.training
    model.eval()
    loss_sum, tokens = 0.0, 0
    try:
        for batch_ids in tqdm(batches, desc="validation loss", unit="batch", disable=not progress):
            batch = collate([dataset[i] for i in batch_ids], pad_token_id)
            batch = decode_batch({k: v.to(device) for k, v in batch.items()}, codec)
            s, n = token_loss_sum(model, batch)
            loss_sum += s
            tokens += n
    finally:
        model.train(was_training)
    return loss_sum, tokens


def _sum_over_ranks(values: list[float], device, world: int) -> list[float]:
    """``values`` summed over all ranks in float64 (as they are on one rank)."""
    totals = torch.tensor(values, dtype=torch.float64)
    if world > 1:
        import torch.distributed as dist

        # NCCL reduces only device tensors; Gloo takes CPU ones.
        on = torch.device(device) if dist.get_backend() == "nccl" else torch.device("cpu")
        totals = totals.to(on)
        dist.all_reduce(totals)
        totals = totals.cpu()
    return totals.tolist()
