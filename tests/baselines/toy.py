"""A tiny picklable dataset whose lengths can change with ``set_epoch`` (augmentation).

Sample ``i`` has ``input_ids`` of its length; the first quarter of its labels is masked
(a "prompt"), so loss-token counts differ from lengths. With ``augment`` the length of
every sample is rescaled by a factor drawn from ``(seed, epoch, i)`` in ``[0.6, 1.4]``,
like the pipeline's random-resize augmentation.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

IGNORE = -100


def toy_lengths(n: int, seed: int = 0, low: int = 4, high: int = 120) -> list[int]:
    """Seeded lengths with a long tail (many short samples, a few long ones)."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(3.3, 0.8, n), low, high).round()]


class ToyDataset(torch.utils.data.Dataset):
    """Map-style dataset of dict samples with a ``fingerprint()`` and ``set_epoch``."""

    def __init__(
        self,
        n: int = 60,
        seed: int = 0,
        augment: bool = False,
        cutoff: int = 160,
        fail_index: int | None = None,
    ):
        self.base = toy_lengths(n, seed)
        self.fail_index = fail_index
        self.seed = seed
        self.augment = augment
        self.cutoff = cutoff
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.base)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def length(self, index: int) -> int:
        if not self.augment:
            return self.base[index]
        rng = np.random.default_rng([self.seed, self.epoch, index])
        return int(min(self.cutoff, max(2, round(self.base[index] * rng.uniform(0.6, 1.4)))))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index == self.fail_index:
            raise ValueError(f"sample {index} is corrupt")
        n = self.length(index)
        ids = (torch.arange(n) * 7 + index) % 97 + 3
        labels = ids.clone()
        labels[: n // 4] = IGNORE
        return {"input_ids": ids, "labels": labels}

    def fingerprint(self) -> str:
        parts = f"{self.base}|{self.seed}|{self.augment}|{self.cutoff}"
        return hashlib.sha256(parts.encode()).hexdigest()[:16]


def make_toy(**kwargs) -> ToyDataset:
    """A factory for the length-cache command line (``--factory``)."""
    return ToyDataset(**kwargs)


def as_int(value: str) -> int:
    """A nested factory for the ``_target_`` test of ``--kwargs``."""
    return int(value)
