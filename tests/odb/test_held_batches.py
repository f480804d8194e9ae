"""The grouping buffer's byte cap counts the batches the trainer still holds, in both modes.

A collate thread sees a batch freed through a weak reference; a collate process sees
its pool block come back (``odb._process.handoff.PoolWriter.held_bytes``). A consumer that keeps
every batch therefore leaves the buffer one sample at a time once it holds the cap;
once it lets them go, full steps return; every sample arrives once.

Both hold in every interleaving of the trainer and the collate side: the kept batches
only grow, and the blocks of the batches let go are back (thread: at once; process:
sent on the trainer's next receive, before it takes a batch) before the collate side
can emit more than the queue's depth of further batches.
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


KEEP_STEPS = 30  # the consumer keeps the batches of its first 30 steps, then none


def _epoch(mode: str) -> tuple[list[int], list[int]]:
    """One epoch whose consumer keeps its first ``KEEP_STEPS`` batches, then lets go."""
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
    for step, batch in enumerate(loader):
        info = odb.pop_step_info(batch)
        sizes.append(len(info.sample_ids))
        seen += batch["index"].flatten().tolist()
        if step < KEEP_STEPS:
            kept.append(batch)
        else:
            kept.clear()
    del loader
    return sizes, seen


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_consumer_that_keeps_every_batch_fills_the_cap(mode: str) -> None:
    sizes, seen = _epoch(mode)
    assert sorted(seen) == list(range(len(LENGTHS)))
    # The first round reads up to the cap (nothing is held yet); from then on the kept
    # batches alone exceed it, so every round reads one sample: one per step.
    assert sizes[1 : KEEP_STEPS + 1] == [1] * KEEP_STEPS, sizes
    # Let go: within the queue's depth of steps the blocks are back, and the next round
    # reads again up to the cap: a full step (the 50 samples left leave room for it).
    assert max(sizes[KEEP_STEPS + 1 :]) >= 5, sizes
