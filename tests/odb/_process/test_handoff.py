"""The process-mode hand-off alone: pool blocks leased to the trainer, in one process.

The writer (collate side) and the reader (trainer side) talk over a real pipe; the
queue in between is replaced by passing the encoded bytes on. End to end through a
collate process: ``tests/odb/_process/test_trainer_runner.py``.
"""

from __future__ import annotations

import gc
import multiprocessing
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch

import odb
import odb._process.handoff as handoff
from odb._process.batch_pool import share_batches
from odb._process.handoff import PoolReader, PoolWriter
from odb.core.step_info import StepInfo


def _pair() -> tuple[PoolWriter, PoolReader]:
    reader_end, writer_end = multiprocessing.Pipe(duplex=False)
    return PoolWriter(reader_end), PoolReader(writer_end)


def _send(writer: PoolWriter, batch: Any) -> tuple[Any, ...]:
    kind, payload = ForkingPickler.loads(writer.encode(("step", batch)))
    assert kind == "pooled"
    return payload


def _hand_over(writer: PoolWriter, reader: PoolReader, batch: Any) -> Any:
    return reader.decode(*_send(writer, batch))


def _in_block(reader: PoolReader, tensor: torch.Tensor) -> int | None:
    """The id of the trainer-side block ``tensor``'s memory lies in, if any."""
    address = tensor.data_ptr()
    for block, mapped in reader._blocks.items():
        if mapped.data_ptr() <= address < mapped.data_ptr() + mapped.numel():
            return block
    return None


def _settle(writer: PoolWriter, reader: PoolReader) -> None:
    """Whatever the trainer let go of reaches the writer."""
    gc.collect()
    reader.flush()
    writer.pool.collect()


def _info() -> StepInfo:
    return StepInfo(0, 0, 0, False, (3, 1), 2, 2, 5, 5, 5, 5.0, 1, 0)


def test_round_trip_keeps_values_views_and_other_fields_without_a_copy() -> None:
    writer, reader = _pair()
    ids = torch.arange(12).view(3, 4)
    batch = {
        "input_ids": ids,
        "view": ids[1:].t(),  # a strided view of the same storage
        "half": torch.ones(3, dtype=torch.bfloat16),
        "grad": torch.ones(2, requires_grad=True),
        "empty": torch.empty(0, 5),
        "names": ["a", "b"],
        odb.STEP_INFO_KEY: _info(),
    }
    out = _hand_over(writer, reader, batch)
    assert torch.equal(out["input_ids"], ids) and torch.equal(out["view"], ids[1:].t())
    assert out["view"].stride() == ids[1:].t().stride()
    assert out["half"].dtype == torch.bfloat16 and out["grad"].requires_grad
    assert out["empty"].shape == (0, 5) and out["names"] == ["a", "b"]
    assert out[odb.STEP_INFO_KEY] == _info()
    assert _in_block(reader, out["input_ids"]) is not None  # a view of the block: no copy
    out["input_ids"][1, 0] = -1  # still views of one storage; the sender's is untouched
    assert out["view"][0, 0] == -1 and ids[1, 0] == 4


def test_a_field_built_in_the_pool_crosses_in_its_own_block() -> None:
    writer, reader = _pair()
    share_batches(writer.pool)
    try:
        pixels = odb.batch_cat([torch.randn(40_000, 4), torch.randn(30_000, 4)])
    finally:
        share_batches(None)
    expected = pixels.clone()
    new, dropped, rest, blob = _send(writer, {"pixels": pixels, "ids": torch.arange(4)})
    assert len(new) == 2 and rest is not None  # the pixels' block and the rest block
    out = reader.decode(new, dropped, rest, blob)
    assert torch.equal(out["pixels"], expected)
    assert _in_block(reader, out["pixels"]) not in (None, rest)


def test_a_held_batch_keeps_its_block_and_a_dropped_one_is_reused() -> None:
    writer, reader = _pair()
    held = [_hand_over(writer, reader, {"x": torch.full((1000,), step)}) for step in range(5)]
    assert len(writer.pool._blocks) == 5  # the consumer keeps them all: nothing waits
    assert [int(b["x"].unique()) for b in held] == list(range(5))
    del held
    _settle(writer, reader)
    new, dropped, rest, blob = _send(writer, {"x": torch.zeros(10)})
    assert new == [] and len(writer.pool._blocks) == 5  # a returned block, reused
    assert torch.equal(reader.decode(new, dropped, rest, blob)["x"], torch.zeros(10))


def test_a_block_is_not_reused_while_the_trainer_holds_it() -> None:
    writer, reader = _pair()
    first = _hand_over(writer, reader, {"x": torch.ones(100)})
    _settle(writer, reader)
    second = _hand_over(writer, reader, {"x": torch.zeros(100)})
    assert _in_block(reader, first["x"]) != _in_block(reader, second["x"])
    assert torch.equal(first["x"], torch.ones(100))


def test_an_unpicklable_batch_raises_and_leaves_no_lease() -> None:
    writer, reader = _pair()
    share_batches(writer.pool)
    try:
        big = odb.batch_empty((100_000,))
    finally:
        share_batches(None)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        writer.encode(("step", {"big": big, "f": lambda: 0}))
    del big
    _settle(writer, reader)
    assert writer.pool._holders == {}


def test_a_shared_storage_from_elsewhere_crosses_by_descriptor() -> None:
    writer, reader = _pair()
    pixels = torch.randn(1000).share_memory_()  # as a DataLoader worker sends a sample
    new, dropped, rest, blob = _send(writer, {"pixels": pixels, "ids": torch.arange(4)})
    assert [block for block, _ in new] == [rest]  # only the ids were copied
    out = reader.decode(new, dropped, rest, blob)
    assert out["pixels"].is_shared() and torch.equal(out["pixels"], pixels)
    pixels.zero_()  # the same memory, handed over
    assert torch.equal(out["pixels"], torch.zeros(1000))


def test_the_epochs_end_drops_free_blocks_and_sends_the_rest_anew() -> None:
    writer, reader = _pair()
    kept = _hand_over(writer, reader, {"x": torch.ones(10)})
    dropped = _hand_over(writer, reader, {"x": torch.ones(10)})
    del dropped
    _settle(writer, reader)
    writer.end_epoch()
    reader.end_epoch()
    assert len(writer.pool._blocks) == 1  # the free one went; the kept one is leased
    del kept
    _settle(writer, reader)
    new, dropped, rest, blob = _send(writer, {"x": torch.zeros(10)})
    assert [block for block, _ in new] == [rest]  # mapped anew after the epoch's end
    assert torch.equal(reader.decode(new, dropped, rest, blob)["x"], torch.zeros(10))


def test_at_most_max_free_blocks_stay_free_and_the_trainer_unmaps_the_dropped() -> None:
    writer, reader = _pair()
    held = [_hand_over(writer, reader, {"x": torch.ones(10)}) for _ in range(12)]
    del held
    _settle(writer, reader)
    _hand_over(writer, reader, {"x": torch.ones(handoff.BLOCK_MIN_BYTES)})  # fits none
    assert len(writer.pool._blocks) <= handoff.MAX_FREE_BLOCKS
    assert set(reader._blocks) == set(writer.pool._blocks)  # nothing dropped stays mapped


def test_the_writer_counts_the_batches_the_trainer_holds_until_it_frees_them() -> None:
    """What the buffer's byte cap counts beside the buffer: a batch is held from its
    encoding until the trainer frees it, whatever order the trainer frees them in, and
    a block reused for a later batch ends the earlier batch, not the later one."""
    writer, reader = _pair()
    first = _hand_over(writer, reader, {"x": torch.zeros(1000)})  # 4000 bytes
    second = _hand_over(writer, reader, {"x": torch.zeros(250)})  # 1000 bytes
    assert writer.held_bytes() == 5000
    del first
    _settle(writer, reader)
    assert writer.held_bytes() == 1000
    third = _hand_over(writer, reader, {"x": torch.zeros(500)})  # may reuse first's block
    del second
    _settle(writer, reader)
    assert writer.held_bytes() == 2000
    del third
    _settle(writer, reader)
    assert writer.held_bytes() == 0
