"""The slab hand-off alone: :class:`odb.handoff.SlabWriter` and :class:`odb.handoff.SlabReader`.

Both ends run in one process over a real pipe, with real shared-memory slabs.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch

import odb
import odb.handoff as handoff
from odb.handoff import SlabReader, SlabWriter
from odb.step_info import StepInfo


def _pair(slots: int = 3) -> tuple[SlabWriter, SlabReader]:
    reader_end, writer_end = multiprocessing.Pipe(duplex=False)
    return SlabWriter(reader_end, slots), SlabReader(writer_end, slots)


def _send(writer: SlabWriter, batch: Any) -> tuple[str, Any]:
    blob = writer.encode(("step", batch), threading.Event())
    assert blob is not None
    return ForkingPickler.loads(blob)


def _hand_over(writer: SlabWriter, reader: SlabReader, batch: Any) -> Any:
    kind, payload = _send(writer, batch)
    assert kind == "slab"
    return reader.decode(*payload)


def _info() -> StepInfo:
    return StepInfo(0, 0, 0, False, (3, 1), 2, 2, 5, 5, 5, 5.0, 1, 0)


def test_round_trip_keeps_values_views_and_other_fields() -> None:
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
    out["input_ids"][1, 0] = -1  # still views of one storage, and a private copy
    assert out["view"][0, 0] == -1 and ids[1, 0] == 4
    assert not out["input_ids"].is_shared()


def test_slot_reuse_leaves_a_held_batch_intact() -> None:
    writer, reader = _pair(slots=1)
    held = [_hand_over(writer, reader, {"x": torch.full((1000,), step)}) for step in range(5)]
    assert [int(b["x"].unique()) for b in held] == list(range(5))


def test_a_slot_is_not_reused_before_the_trainer_returns_it() -> None:
    writer, reader = _pair(slots=3)
    first, second = (_send(writer, {"x": torch.zeros(4)}) for _ in range(2))
    assert (first[1][0], second[1][0]) == (0, 1)
    reader.decode(*second[1])  # slot 1 comes back; the lowest free slot is taken
    assert _send(writer, {"x": torch.zeros(4)})[1][0] == 1


def test_a_bigger_batch_grows_the_slab_once() -> None:
    writer, reader = _pair(slots=1)
    small = _send(writer, {"x": torch.zeros(10)})
    assert small[1][1].numel() == handoff.SLAB_MIN_BYTES  # a new slab travels once
    reader.decode(*small[1])
    big = torch.arange(2 * handoff.SLAB_MIN_BYTES // 8)  # twice the first slab
    kind, payload = _send(writer, {"x": big})
    assert kind == "slab" and payload[1].numel() >= big.numel() * 8
    assert torch.equal(reader.decode(*payload)["x"], big)
    again = _send(writer, {"x": torch.zeros(10)})
    assert again[1][1] is None  # the grown slab stays


def test_a_batch_over_the_cap_takes_torch_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "SLAB_MAX_BYTES", 1024)
    writer, reader = _pair(slots=1)
    big = torch.arange(1000)
    kind, batch = _send(writer, {"x": big, "n": 3})
    assert kind == "step" and torch.equal(batch["x"], big) and batch["n"] == 3
    assert writer._free == {0}  # the slot was not used
    assert torch.equal(_hand_over(writer, reader, {"x": torch.arange(10)})["x"], torch.arange(10))


def test_an_unpicklable_batch_raises_and_frees_its_slot() -> None:
    writer, _ = _pair(slots=1)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        writer.encode(("step", {"f": lambda: 0}), threading.Event())
    assert writer._free == {0}


def test_waiting_for_a_slot_ends_when_stopped_or_the_trainer_is_gone() -> None:
    writer, reader = _pair(slots=1)
    _send(writer, {"x": torch.zeros(1)})
    stop = threading.Event()
    stop.set()
    assert writer.encode(("step", {"x": torch.zeros(1)}), stop) is None
    reader.close()
    assert writer.encode(("step", {"x": torch.zeros(1)}), threading.Event()) is None


def test_a_shared_storage_crosses_by_descriptor_without_a_slab_copy() -> None:
    writer, reader = _pair(slots=1)
    pixels = torch.randn(1000).share_memory_()
    kind, payload = _send(writer, {"pixels": pixels, "ids": torch.arange(4)})
    assert kind == "slab" and payload[1].numel() == handoff.SLAB_MIN_BYTES  # ids only
    out = reader.decode(*payload)
    assert out["pixels"].is_shared() and torch.equal(out["pixels"], pixels)
    assert not out["ids"].is_shared() and torch.equal(out["ids"], torch.arange(4))
    pixels.zero_()  # the same memory, handed over: the writer built it for the trainer
    assert torch.equal(out["pixels"], torch.zeros(1000))
