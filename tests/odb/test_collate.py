"""batch_cat / batch_empty: shared memory exactly where a batch crosses processes;
batch_parts / TensorParts: a field concatenated only where it lands."""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import odb._process.batch_pool as batch_pool
from odb._process.handoff import BlockPool
from odb.collate import (
    SHARED_MIN_BYTES,
    PadCollate,
    TensorParts,
    batch_cat,
    batch_empty,
    batch_parts,
)

BIG = SHARED_MIN_BYTES // 4  # float32 elements of one shared-size field


@pytest.fixture
def collate_process() -> Iterator[BlockPool]:
    """This process as an ODB collate process: batch fields come from its pool."""
    returns, _ = multiprocessing.Pipe(duplex=False)
    pool = BlockPool(returns)
    batch_pool.share_batches(pool)
    yield pool
    batch_pool.share_batches(None)


def _in_pool(pool: BlockPool, tensor: torch.Tensor) -> bool:
    return any(
        b.data_ptr() <= tensor.data_ptr() < b.data_ptr() + b.numel() for b in pool._blocks.values()
    )


def test_in_the_trainer_nothing_is_shared() -> None:
    assert not batch_pool.batches_cross_processes()
    assert not batch_empty((BIG,)).is_shared()
    assert not batch_cat([torch.ones(BIG), torch.ones(BIG)]).is_shared()


def test_in_a_collate_process_big_fields_come_from_the_pool_small_ones_not(
    collate_process: BlockPool,
) -> None:
    parts = [torch.randn(BIG // 2, 4), torch.randn(BIG // 4, 4)]
    out = batch_cat(parts)
    assert _in_pool(collate_process, out) and out.is_contiguous()
    assert torch.equal(out, torch.cat(parts)) and out.dtype == torch.float32
    assert not _in_pool(collate_process, batch_cat([torch.ones(3), torch.ones(2)]))
    half = batch_empty((2, BIG), torch.bfloat16)
    assert half.shape == (2, BIG) and _in_pool(collate_process, half)


def test_mixed_inputs_fall_back_to_torch_cat(collate_process: BlockPool) -> None:
    parts = [torch.ones(BIG, dtype=torch.int32), torch.ones(BIG, dtype=torch.int64)]
    out = batch_cat(parts)
    assert out.dtype == torch.int64 and torch.equal(out, torch.cat(parts))
    with pytest.raises(ValueError, match="no tensors"):
        batch_cat([])


def test_pad_collate_builds_big_fields_in_the_pool_in_a_collate_process(
    collate_process: BlockPool,
) -> None:
    samples = [
        {"input_ids": torch.tensor([1, 2]), "pixel_values": torch.randn(BIG // 8, 8)}
        for _ in range(3)
    ]
    batch = PadCollate()(samples)
    assert _in_pool(collate_process, batch["pixel_values"])
    assert not _in_pool(collate_process, batch["input_ids"])
    assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in samples]))


class _Pixels(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((BIG,), float(i))


def _shared_flags(batch: list[torch.Tensor]) -> tuple[bool, torch.Tensor]:
    out = batch_cat(batch)
    return out.is_shared(), out


@pytest.mark.dist
def test_in_a_dataloader_worker_the_batch_is_built_shared() -> None:
    loader = DataLoader(_Pixels(), batch_size=2, num_workers=1, collate_fn=_shared_flags)
    ((shared_in_worker, out),) = list(loader)
    assert shared_in_worker and torch.equal(out[BIG:], torch.ones(BIG))


def _uses_a_pool(batch: list[torch.Tensor]) -> tuple[bool, bool]:
    return batch_pool.own_pool() is not None, batch_cat(batch).is_shared()


@pytest.mark.dist
def test_a_worker_forked_from_a_collate_process_does_not_use_its_pool(
    collate_process: BlockPool,
) -> None:
    ctx = multiprocessing.get_context("fork")
    loader = DataLoader(
        _Pixels(), batch_size=2, num_workers=1, collate_fn=_uses_a_pool, multiprocessing_context=ctx
    )
    assert list(loader) == [(False, True)]  # new shared memory, as default_collate's


def test_tensor_parts_stand_for_their_concatenation() -> None:
    parts = [torch.randn(3, 4), torch.randn(5, 4)]
    field = batch_parts(parts)
    assert field.shape == (8, 4) and field.size(0) == 8 and field.size() == (8, 4)
    assert field.dtype == torch.float32 and field.device.type == "cpu"
    assert field.numel() == 32
    assert torch.equal(field.to("cpu"), torch.cat(parts))
    assert torch.equal(field.cat(), torch.cat(parts))
    half = field.to(torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, torch.cat(parts).bfloat16())
    alone = torch.randn(2, 4)
    assert batch_parts([alone]).cat() is alone  # one part: no copy
    assert batch_parts([torch.tensor(1), torch.tensor(2)]).cat().tolist() == [1, 2]
    assert "2 parts, shape=(8, 4)" in repr(field)
    with pytest.raises(AttributeError, match="'view'.*call .to\\(device\\)"):
        field.view(-1)


def test_tensor_parts_reject_what_cannot_be_concatenated() -> None:
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorParts([])
    with pytest.raises(ValueError, match="part 1 .*trailing shape \\(3,\\).*torch.cat"):
        TensorParts([torch.ones(2, 4), torch.ones(2, 3)])
    with pytest.raises(ValueError, match="part 1 .*torch.int64"):
        TensorParts([torch.ones(2), torch.ones(2, dtype=torch.long)])
    with pytest.raises(ValueError, match="part 0 .*0-d tensor"):
        TensorParts([torch.tensor(1.0)])
    with pytest.raises(ValueError, match="part 0 .*list"):
        TensorParts([[1.0]])


def test_tensor_parts_pickle_as_their_parts_and_keep_shared_memory() -> None:
    shared = torch.randn(BIG).share_memory_()
    field = batch_parts([shared, torch.ones(3)])
    again = pickle.loads(pickle.dumps(field))
    assert isinstance(again, TensorParts) and torch.equal(again.cat(), field.cat())
    crossed = ForkingPickler.loads(ForkingPickler.dumps(field))  # as a Queue sends it
    assert crossed.parts[0].is_shared()
    shared.zero_()  # the same memory, not a copy
    assert torch.equal(crossed.parts[0], torch.zeros(BIG))
