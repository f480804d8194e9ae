"""Packing: greedy-knapsack rows of concatenated samples, isolated from each other.

The plan (:class:`PackingPlan`) fills rows of up to ``token_budget`` packed tokens from
the length cache, shuffles them and deals them round-robin (batch size 1 per rank);
the collate (:class:`PackCollate`) concatenates a row's samples.

A packed row must train exactly as its samples would unpacked. Three things make that
so (checked against the tiny Qwen3-VL in ``tests/baselines/methods/test_packing.py``):

* ``position_ids`` restart at 0 for every sample;
* attention never crosses a sample boundary. With transformers 5.24 under ``sdpa`` and
  ``eager`` (the CPU train path), restarted ``position_ids`` alone do **not** isolate
  the samples (see ``reference/VERIFIED.md``); an explicit additive block-causal mask of
  shape ``(1, 1, L, L)`` (0 where allowed, ``-inf`` elsewhere) does. A
  ``flash_attention_2`` path reads the boundaries from ``position_ids`` instead and
  should be given ``block_mask=False`` (the ``L x L`` mask costs ``4 L^2`` bytes);
* the first label of each sample is masked: after the causal shift it would be
  predicted from the previous sample's last token, a target the unpacked run never has.

Packing is text-only: samples with images are refused.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import odb
import odb.kit
from baselines.plans import Plan, StepIds, deal, shuffled
from baselines.sizing import TokenBudgetedLoader

__all__ = ["PackCollate", "PackingLoader", "PackingPlan", "block_causal_mask"]

_VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


def block_causal_mask(lengths: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask ``(1, 1, L, L)``: 0 where token ``i`` may see token ``j``, else -inf.

    Token ``i`` sees ``j`` when both lie in the same sample and ``j <= i``.

    Example:
        >>> block_causal_mask([2, 1])[0, 0]
        tensor([[0., -inf, -inf],
                [0., 0., -inf],
                [-inf, -inf, 0.]])
    """
    segment = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.as_tensor(list(lengths), dtype=torch.long)
    )
    total = segment.numel()
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(
        total, total, dtype=torch.bool
    ).tril()
    mask = torch.zeros(total, total, dtype=dtype)
    mask.masked_fill_(~allowed, float("-inf"))
    return mask[None, None]


@dataclass(frozen=True)
class PackCollate:
    """Concatenate a group of text samples into one packed row (batch size 1).

    Every 1-D per-token field of the samples (``input_ids``, ``labels``,
    ``mm_token_type_ids``, ...) is concatenated; the samples' own ``attention_mask`` is
    replaced by the block-causal mask; ``position_ids`` restart per sample.

    Attributes:
        ignore_index: Label that carries no loss (the first label of each sample).
        block_mask: Add the ``(1, 1, L, L)`` block-causal ``attention_mask`` (needed by
            ``sdpa``/``eager``). False leaves isolation to ``position_ids``
            (``flash_attention_2``).
        mask_dtype: dtype of the additive mask (the model's compute dtype).
        label_key: Field holding the labels.

    Example:
        >>> a = {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([5, 6, 7])}
        >>> b = {"input_ids": torch.tensor([8, 9]), "labels": torch.tensor([8, 9])}
        >>> row = PackCollate()([a, b])
        >>> row["position_ids"].tolist(), row["labels"].tolist()
        ([[0, 1, 2, 0, 1]], [[-100, 6, 7, -100, 9]])
        >>> row["attention_mask"].shape
        torch.Size([1, 1, 5, 5])
    """

    ignore_index: int = -100
    block_mask: bool = True
    mask_dtype: torch.dtype = torch.float32
    label_key: str = "labels"

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("PackCollate got an empty group")
        lengths = [_length(i, s) for i, s in enumerate(samples)]
        keys = [k for k in samples[0] if k != "attention_mask"]
        row: dict[str, Any] = {}
        for key in keys:
            parts = []
            for i, sample in enumerate(samples):
                value = torch.as_tensor(sample[key])
                if value.dim() != 1 or value.shape[0] != lengths[i]:
                    raise ValueError(
                        f"PackCollate packs 1-D per-token fields; sample {i} has {key!r} of "
                        f"shape {tuple(value.shape)} for {lengths[i]} tokens. Drop the field "
                        "or use a padded collate"
                    )
                if key == self.label_key:
                    value = value.clone()
                    value[0] = self.ignore_index
                parts.append(value)
            row[key] = torch.cat(parts)[None]
        row["position_ids"] = torch.cat([torch.arange(n) for n in lengths])[None]
        if self.block_mask:
            row["attention_mask"] = block_causal_mask(lengths, self.mask_dtype)
        return row


def _length(index: int, sample: Mapping[str, Any]) -> int:
    vision = [k for k in _VISION_KEYS if k in sample]
    if vision:
        raise ValueError(
            f"packing is text-only, but sample {index} of the group has {vision}; "
            "use a padded method (standard, sorted, gmt, bmt, odb) for multimodal data"
        )
    if "input_ids" not in sample:
        raise ValueError(f"sample {index} has no 'input_ids' (fields: {sorted(sample)})")
    return int(torch.as_tensor(sample["input_ids"]).shape[0])


@dataclass(frozen=True)
class PackingPlan:
    """Greedy-knapsack rows of up to ``budget`` packed tokens, shuffled, dealt round-robin.

    The budget must use the ``"packed"`` cost model. ``budget.admits`` has the last word
    on every placement, so an oversize sample still gets a row of its own.

    Example:
        >>> PackingPlan(odb.TokenBudget(8, "packed"), lengths=(5, 3, 6, 2, 1), shuffle=False)(
        ...     range(5), world_size=2, seed=0)
        [[(2, 3), (4,)], [(0, 1), ()]]
    """

    budget: odb.TokenBudget
    lengths: Sequence[int] = field(repr=False)
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.budget.cost_model != "packed":
            raise ValueError(
                f"PackingPlan needs a 'packed' cost model, got {self.budget.cost_model!r}: "
                "a packed row costs the sum of its lengths"
            )

    def rows(self, pool: Sequence[int]) -> list[StepIds]:
        """The rows, in the order they were filled (longest first sample first)."""
        # Ascending (length, index): bisect finds the longest sample within a capacity.
        remaining = sorted((int(self.lengths[i]), i) for i in pool)
        rows = []
        while remaining:
            length, index = remaining.pop()
            row, m = [index], odb.kit.GroupMeasure().plus(length)
            while remaining:
                room = self.budget.max_tokens - m.sum_len
                pos = bisect.bisect_right(remaining, (room, float("inf"))) - 1
                if pos < 0 or not self.budget.admits(m, remaining[pos][0]):
                    break
                length, index = remaining.pop(pos)
                row.append(index)
                m = m.plus(length)
            rows.append(tuple(row))
        return rows

    def __call__(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        return deal(shuffled(self.rows(pool), seed, self.shuffle), world_size)


class PackingLoader(TokenBudgetedLoader):
    """Text-only packed rows of up to ``token_budget`` tokens (batch size 1 per rank).

    The default collate is :class:`PackCollate` (restarted
    ``position_ids``, block-causal 4-D mask, first label of each sample masked). The
    budget's cost model is ``"packed"``; a ``"padded"`` one is refused.
    """

    method = "packing"
    default_cost_model = "packed"

    def _setup(self) -> None:
        super()._setup()
        if self.budget.cost_model != "packed":
            raise ValueError(
                "packing prices a row by the sum of its lengths: leave cost_model=None or "
                f"set 'packed', got {self.config.cost_model!r}"
            )
        if self.patches is not None and any(self.patches):
            raise ValueError(
                "packing is text-only, but the length cache has samples with visual "
                "patches; use gmt, bmt or odb for multimodal data"
            )

    def _default_collate(self) -> Callable[[list[Any]], Any]:
        return PackCollate(ignore_index=self.config.ignore_index, label_key=self.config.label_key)

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        assert self.lengths is not None
        return PackingPlan(self.budget, self.lengths, self.config.shuffle)(pool, world_size, seed)
