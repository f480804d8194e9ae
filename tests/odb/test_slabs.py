"""Recycled shared memory for the workers' sample tensors (``odb.slabs``).

In one process: a worker's placement and the collate side's reception over a real pool,
when a slab is free again, and what a deal reconciles. End to end through a collate
process: every sample's bytes arrive intact while the consumer keeps batches and views
of them, and the slabs are written again, within an epoch and in the next.
"""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

import pytest
import torch

import odb
import odb.slabs as slabs
from odb.collate import PadCollate, batch_parts
from odb.handoff import BlockPool

MIB = 1 << 20


@pytest.fixture
def arena() -> Any:
    reader_end, _writer_end = multiprocessing.Pipe(duplex=False)
    slabs.open_arena(BlockPool(reader_end))
    yield slabs.current_arena()
    slabs.open_arena(None)


def _bytes_of(value: int, nbytes: int) -> torch.UntypedStorage:
    return torch.full((nbytes,), value, dtype=torch.uint8).untyped_storage()


def _received(placed: tuple[int, int, Any]) -> torch.Tensor:
    storage = slabs.rebuild_slab(*placed)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def test_a_slab_is_written_again_only_once_nobody_holds_it(arena: Any) -> None:
    worker = arena.deal(1, keep_bytes=1 << 30).for_worker(0)
    first = worker.place(_bytes_of(7, 2 * MIB))
    assert first is not None and first[2] is not None  # a new slab, sent once
    got = _received(first)
    slot = first[0]
    assert arena.status[slot] == slabs.BUSY
    second = worker.place(_bytes_of(9, 2 * MIB))  # the first is still held
    assert second is not None and second[0] != slot and second[2] is not None
    other = _received(second)
    assert int(got.min()) == int(got.max()) == 7 and int(other.max()) == 9
    del got
    gc.collect()
    assert not arena.pool.is_held(arena._block_of[slot])  # collect() ran: it is free
    assert arena.status[slot] == slabs.FREE
    third = worker.place(_bytes_of(5, 2 * MIB - 4096))
    assert third is not None and third[0] == slot and third[2] is None  # reused
    again = _received(third)
    assert again.numel() == 2 * MIB  # the whole slab: the window counts what it keeps
    assert int(again[: 2 * MIB - 4096].min()) == int(again[: 2 * MIB - 4096].max()) == 5
    assert int(other.min()) == 9  # the held one was never touched
    assert arena.reused_bytes == 2 * MIB - 4096 and arena.new_bytes == 4 * MIB


def test_a_free_slab_takes_no_storage_far_smaller_than_itself(arena: Any) -> None:
    worker = arena.deal(1, keep_bytes=1 << 30).for_worker(0)
    big = worker.place(_bytes_of(1, 8 * MIB))
    assert big is not None
    _received(big)  # dropped at once: the slab is free
    gc.collect()
    arena.pool.collect()
    small = worker.place(_bytes_of(2, 2 * MIB))
    assert small is not None and small[0] != big[0] and small[2] is not None
    assert worker.place(_bytes_of(3, 1024)) is None  # small storages go torch's way


def test_a_deal_frees_slabs_whose_message_never_arrived_and_trims_to_the_cap(arena: Any) -> None:
    worker = arena.deal(1, keep_bytes=1 << 30).for_worker(0)
    held = [_received(worker.place(_bytes_of(i, 2 * MIB))) for i in range(3)]
    lost_new = worker.place(_bytes_of(4, 2 * MIB))  # never received: no slab adopted
    assert lost_new is not None and arena.status[lost_new[0]] == slabs.BUSY
    del held[0]
    gc.collect()
    arena.pool.collect()  # the collate process does so on every read
    lost_reuse = worker.place(_bytes_of(5, 2 * MIB))  # reuses the freed one, never received
    assert lost_reuse is not None and lost_reuse[2] is None
    assert arena.status[lost_reuse[0]] == slabs.BUSY
    deal = arena.deal(2, keep_bytes=1 << 30)
    assert arena.status[lost_new[0]] == slabs.EMPTY
    assert arena.status[lost_reuse[0]] == slabs.FREE
    assert sum(len(share.free) for share in deal.shares) == 1
    assert all(len(share.empty) == slabs.EMPTY_PER_WORKER for share in deal.shares)
    del held
    gc.collect()
    arena.pool.collect()
    deal = arena.deal(1, keep_bytes=2 * MIB)  # three free slabs of 2 MiB, room for one
    assert sum(len(share.free) for share in deal.shares) == 1
    assert int((arena.status == slabs.FREE).sum()) == 1


def test_a_worker_retires_free_slabs_beyond_its_cap_before_it_makes_one(arena: Any) -> None:
    worker = arena.deal(1, keep_bytes=6 * MIB).for_worker(0)  # retires beyond 3 MiB
    small, large = (worker.place(_bytes_of(1, n * MIB)) for n in (2, 4))
    _received(small), _received(large)  # dropped at once: both free, 6 MiB in all
    gc.collect()
    arena.pool.collect()
    big = worker.place(_bytes_of(2, 8 * MIB))  # fits neither: a new slab, after retiring
    assert arena.status[large[0]] == slabs.RETIRED  # the largest, down to 2 MiB <= 3 MiB
    assert arena.status[small[0]] == slabs.FREE
    _received(big)  # the collate side drops the retired slab as the new one arrives
    assert arena.status[large[0]] == slabs.EMPTY and large[0] not in arena._block_of
    again = worker.place(_bytes_of(3, 2 * MIB))
    assert again is not None and again[0] == small[0] and again[2] is None


PIXELS = 600_000  # float32: 2.4 MB per sample, above slabs.MIN_BYTES
SAMPLES = 48


class PixelDataset:
    """Each sample's pixels hold its index, so a rewritten slab shows as a wrong value."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.full((10 + index % 7,), 3)
        return {
            "input_ids": ids,
            "labels": ids.clone(),
            "index": torch.tensor([index]),
            "pixels": torch.full((1, PIXELS), float(index)),
        }


def _collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    fields = ("input_ids", "labels", "index")
    batch = PadCollate()([{k: s[k] for k in fields} for s in samples])
    return {**batch, "pixels": batch_parts([s["pixels"] for s in samples])}


def test_samples_arrive_intact_through_recycled_slabs_while_batches_are_kept() -> None:
    loader = odb.ODBLoader(
        PixelDataset(),
        token_budget=64,
        collate_fn=_collate,
        num_workers=2,
        queue_depth=2,
        window_bytes=20_000_000,  # about 8 samples: the window turns over within an epoch
        seed=0,
    )
    assert loader.config.collate_mode == "process"
    kept_view = None
    stats = []
    for _ in range(3):
        recent: list[Any] = []
        seen = []
        for batch in loader:
            odb.pop_step_info(batch)
            indices = batch["index"].flatten().tolist()
            seen += indices
            for index, part in zip(indices, batch["pixels"].parts, strict=True):
                assert part.shape == (1, PIXELS)
                assert float(part.min()) == float(part.max()) == float(index)
            if kept_view is None:
                kept_view = (indices[0], batch["pixels"].parts[0][0, 100:200])
            recent = (recent + [batch])[-3:]  # the consumer keeps the last three batches
            for earlier in recent:
                for index, part in zip(
                    earlier["index"].flatten().tolist(), earlier["pixels"].parts, strict=True
                ):
                    assert float(part[0, -1]) == float(index)
        assert sorted(seen) == list(range(SAMPLES))
        stats.append(loader.stats())
    index, view = kept_view
    assert float(view.min()) == float(view.max()) == float(index)
    sample_bytes = SAMPLES * PIXELS * 4
    for epoch in stats:  # every sample's pixels went into a slab
        assert epoch["shm_reused_bytes"] + epoch["shm_new_bytes"] == sample_bytes
    # Batches are freed as the epoch goes, so slabs are written again within the first
    # epoch (the window holds a sixth of it), and the later epochs' workers inherit the
    # slabs of the ones before.
    assert stats[0]["shm_reused_bytes"] > 0
    assert stats[2]["shm_reused_bytes"] > stats[0]["shm_reused_bytes"]
    del loader


def test_thread_mode_keeps_torchs_shared_memory() -> None:
    loader = odb.ODBLoader(
        PixelDataset(), token_budget=64, collate_fn=_collate, num_workers=1, collate_mode="thread"
    )
    for batch in loader:
        for index, part in zip(
            batch["index"].flatten().tolist(), batch["pixels"].parts, strict=True
        ):
            assert float(part.max()) == float(index)
    assert loader.stats()["shm_reused_bytes"] == loader.stats()["shm_new_bytes"] == 0
