"""The grouping buffer's byte cap counts the batches the trainer still holds, in both modes.

A collate thread sees a batch freed through a weak reference; a collate process sees
its pool block come back (``odb._process.handoff.PoolWriter.held_bytes``). A consumer that keeps
every batch therefore leaves the buffer one sample at a time once it holds the cap,
while one that lets each batch go gets full steps; every sample arrives once.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import odb
from odb.collate import PadCollate, batch_parts

PIXELS = 25_000  # float32: 100 kB of image data per sample
LENGTHS = [20] * 90


class ImageDataset:
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.full((LENGTHS[index],), index % 90 + 3)
        return {
            "input_ids": ids,
            "labels": ids.clone(),
            "index": torch.tensor([index]),
            "pixels": torch.zeros(1, PIXELS),
        }


def collate_images(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    fields = ("input_ids", "labels", "index")
    batch = PadCollate()([{k: s[k] for k in fields} for s in samples])
    return {**batch, "pixels": batch_parts([s["pixels"] for s in samples])}


def _epoch(mode: str, keep: bool) -> tuple[list[int], list[int]]:
    loader = odb.ODBLoader(
        ImageDataset(),
        token_budget=256,  # 12 samples by tokens; the byte cap holds about 10
        collate_fn=collate_images,
        collate_mode=mode,
        num_workers=1,
        shuffle=False,
        buffer_bytes=1_000_000,
        queue_depth=2,
    )
    kept, sizes, seen = [], [], []
    for batch in loader:
        info = odb.pop_step_info(batch)
        sizes.append(len(info.sample_ids))
        seen += batch["index"].flatten().tolist()
        if keep:
            kept.append(batch)
    del loader
    return sizes, seen


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_consumer_that_keeps_every_batch_fills_the_cap(mode: str) -> None:
    free_sizes, free_seen = _epoch(mode, keep=False)
    kept_sizes, kept_seen = _epoch(mode, keep=True)
    assert sorted(free_seen) == sorted(kept_seen) == list(range(len(LENGTHS)))
    assert max(free_sizes[3:]) >= 5  # the whole cap is the buffer's: full steps
    # Kept: after ~10 samples' bytes in held batches, one sample per step (the last
    # ones; the first rounds read before the trainer had received anything).
    assert kept_sizes[-20:] == [1] * 20
