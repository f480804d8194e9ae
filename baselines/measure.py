"""How big a realised sample is: its tokens and its visual patches (the loaders' defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["default_length", "default_patches"]


def default_length(sample: Mapping[str, Any], key: str = "input_ids") -> int:
    """Length of a sample: ``len(sample[key])`` (tensor or list)."""
    value = sample[key]
    return int(value.shape[-1]) if hasattr(value, "shape") else len(value)


def default_patches(sample: Mapping[str, Any]) -> int:
    """Visual patches of a Qwen-VL-style sample: ``image_grid_thw.prod(-1).sum()``, else 0.

    Example:
        >>> import torch
        >>> default_patches({"image_grid_thw": torch.tensor([[1, 4, 6]])})
        24
    """
    grid = sample.get("image_grid_thw")
    return 0 if grid is None else int(grid.prod(-1).sum())
