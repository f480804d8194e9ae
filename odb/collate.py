"""A default collate function for token-budgeted groups of model-ready samples.

Right-pads the sequence fields to the group's longest sample; other tensor fields are
concatenated along the first dimension (how Qwen-VL's ``pixel_values`` and
``image_grid_thw`` batch) and non-tensor fields become lists. Picklable, so it runs in
the collate process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PadCollate:
    """Pad ``input_ids``/``labels``/``attention_mask`` (1-D per sample) into a batch.

    Attributes:
        pad_token_id: Fill value of ``input_ids``.
        ignore_index: Fill value of ``labels``.
        sequence_keys: Fields padded to the longest sample (others are concatenated).

    Example:
        >>> a = {"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1, 2])}
        >>> b = {"input_ids": torch.tensor([3]), "labels": torch.tensor([3])}
        >>> batch = PadCollate()([a, b])
        >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
        ([[1, 2], [3, 0]], [[1, 1], [1, 0]])
    """

    pad_token_id: int = 0
    ignore_index: int = -100
    sequence_keys: tuple[str, ...] = ("input_ids", "labels", "attention_mask", "position_ids")

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("PadCollate got an empty group")
        keys = list(samples[0])
        batch: dict[str, Any] = {}
        for key in keys:
            values = [s[key] for s in samples]
            if key in self.sequence_keys:
                batch[key] = self._pad(key, [torch.as_tensor(v) for v in values])
            elif all(isinstance(v, torch.Tensor) for v in values):
                batch[key] = torch.cat([v if v.dim() else v.reshape(1) for v in values])
            else:
                batch[key] = values
        if "attention_mask" not in batch and "input_ids" in batch:
            lengths = [len(s["input_ids"]) for s in samples]
            width = batch["input_ids"].shape[1]
            batch["attention_mask"] = torch.tensor(
                [[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long
            )
        return batch

    def _pad(self, key: str, values: list[torch.Tensor]) -> torch.Tensor:
        fill = {"input_ids": self.pad_token_id, "labels": self.ignore_index}.get(key, 0)
        width = max(v.shape[-1] for v in values)
        out = torch.full((len(values), width), fill, dtype=values[0].dtype)
        for row, value in enumerate(values):
            out[row, : value.shape[-1]] = value
        return out
