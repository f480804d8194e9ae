"""The trainer hand-off of the collate process (slabs) and the worker hop (inline pickles).

Unit tests drive :class:`odb.runner._SlabWriter` and :class:`odb.runner._SlabReader`
in one process over a real pipe; the rest run ``ODBLoader`` with a real collate process
and check what a consumer holds, big batches, and that nothing grows over epochs.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil
import pytest
import torch

import odb
import odb.runner as runner
from odb.collate import PadCollate
from odb.config import ODBConfig
from odb.engine import EpochJob, SampleMeter
from odb.runner import CollateRunner, CollateSpec, _SlabReader, _SlabWriter
from odb.sources import _InlinePickler
from odb.step_info import StepInfo
from tests.odb.fault_harness import held_shm, leaked_shm, shm_entries


def _pair(slots: int = 3) -> tuple[_SlabWriter, _SlabReader]:
    reader_end, writer_end = multiprocessing.Pipe(duplex=False)
    return _SlabWriter(reader_end, slots), _SlabReader(writer_end, slots)


def _send(writer: _SlabWriter, batch: Any) -> tuple[str, Any]:
    blob = writer.encode(("step", batch), threading.Event())
    assert blob is not None
    return ForkingPickler.loads(blob)


def _hand_over(writer: _SlabWriter, reader: _SlabReader, batch: Any) -> Any:
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
    assert small[1][1].numel() == runner._SLAB_MIN_BYTES  # a new slab travels once
    reader.decode(*small[1])
    big = torch.arange(2 * runner._SLAB_MIN_BYTES // 8)  # twice the first slab
    kind, payload = _send(writer, {"x": big})
    assert kind == "slab" and payload[1].numel() >= big.numel() * 8
    assert torch.equal(reader.decode(*payload)["x"], big)
    again = _send(writer, {"x": torch.zeros(10)})
    assert again[1][1] is None  # the grown slab stays


def test_a_batch_over_the_cap_takes_torch_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_SLAB_MAX_BYTES", 1024)
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


def test_worker_pickle_inlines_small_storages_and_shares_big_ones() -> None:
    ids = torch.arange(10)
    big = torch.zeros(1 << 17)  # 512 KiB, over the inline limit
    item = {"ids": ids, "tail": ids[4:], "big": big, "text": "t"}
    out = pickle.loads(bytes(_InlinePickler.dumps(item, pickle.HIGHEST_PROTOCOL)))
    assert torch.equal(out["ids"], ids) and not out["ids"].is_shared()
    out["ids"][5] = -1
    assert out["tail"][1] == -1  # views of one storage stay views of one storage
    assert out["big"].is_shared() and out["text"] == "t"


class KeyedDataset:
    """Item ``i``: ``input_ids`` whose values encode ``i``, plus optional big pixels."""

    def __init__(self, n: int, pixel_floats: dict[int, int] | None = None) -> None:
        self.n = n
        self.pixel_floats = pixel_floats or {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = torch.full((index % 7 + 2,), index, dtype=torch.long)
        sample = {"input_ids": ids, "labels": ids.clone()}
        if self.pixel_floats:
            sample["pixels"] = torch.full((self.pixel_floats.get(index, 1),), float(index))
        return sample


class Unpicklable:
    """Item 0 holds a lambda: a worker cannot send it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": torch.ones(2, dtype=torch.long), "fn": lambda: index}


class BigSamples:
    """200 KB a sample: under the inline limit, longer than a pipe holds."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = torch.ones(4, dtype=torch.long)
        return {"input_ids": ids, "labels": ids, "pixels": torch.full((50_000,), float(index))}


class SlowCollate:
    """PadCollate after 50 ms, so the workers' result pipe fills up."""

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        time.sleep(0.05)
        return PadCollate()(samples)


def _writing_worker(timeout_s: float = 20.0) -> psutil.Process | None:
    """A DataLoader worker of this process's collate process blocked writing to a pipe."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        me = psutil.Process()
        for proc in me.children(recursive=True):
            try:
                if proc.ppid() == me.pid:
                    continue  # the collate process itself
                tasks = os.listdir(f"/proc/{proc.pid}/task")
                if any("pipe_write" in _wchan(proc.pid, task) for task in tasks):
                    return proc
            except (OSError, psutil.Error):
                continue
        time.sleep(0.1)
    return None


def _wchan(pid: int, task: str) -> str:
    with open(f"/proc/{pid}/task/{task}/wchan") as f:
        return f.read()


def _check_batch(batch: dict[str, Any], info: StepInfo) -> None:
    for row, index in enumerate(info.sample_ids):
        width = index % 7 + 2
        assert torch.equal(batch["input_ids"][row, :width], torch.full((width,), index))


def test_held_batches_stay_intact_across_slot_reuse() -> None:
    loader = odb.ODBLoader(KeyedDataset(300), token_budget=24, num_workers=1, queue_depth=1)
    held = [(b, odb.pop_step_info(b)) for b in loader]  # every slot is reused many times
    assert sorted(i for _, info in held for i in info.sample_ids) == list(range(300))
    for batch, info in held:
        _check_batch(batch, info)


def test_big_batches_grow_slabs_or_bypass_them() -> None:
    cap_floats = runner._SLAB_MAX_BYTES // 4
    pixels = {i: 100_000 for i in range(40)}  # 400 KB a sample: slabs must grow
    pixels[7] = cap_floats + 1  # one batch over the cap: torch's shared memory
    dataset = KeyedDataset(40, pixels)
    loader = odb.ODBLoader(dataset, token_budget=40, num_workers=2, queue_depth=2)
    seen = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        _check_batch(batch, info)
        offset = 0
        for index in info.sample_ids:
            count = pixels[index]
            assert torch.equal(
                batch["pixels"][offset : offset + count], torch.full((count,), float(index))
            )
            offset += count
        seen.extend(info.sample_ids)
    assert sorted(seen) == list(range(40))


def _own_resources() -> tuple[int, set[str]]:
    me = psutil.Process()
    return me.num_fds(), held_shm([me.pid])


def test_three_epochs_leave_no_fds_shm_or_children() -> None:
    loader = odb.ODBLoader(KeyedDataset(200), token_budget=24, num_workers=2)
    sum(1 for _ in loader)  # first use: lazily created resources of this process
    before_shm = shm_entries()
    before = _own_resources()
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sum(odb.pop_step_info(b).local_samples for b in loader) == 200
    assert _own_resources() == before
    assert not leaked_shm(before_shm)
    assert not multiprocessing.active_children()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_unpicklable_sample_raises_in_its_worker(mode: str) -> None:
    loader = odb.ODBLoader(Unpicklable(), token_budget=8, num_workers=1, collate_mode=mode)
    with pytest.raises(Exception, match="DataLoader worker"):
        list(loader)


def test_a_clean_collate_process_exits_with_code_zero() -> None:
    config = ODBConfig(token_budget=24, num_workers=1)
    spec = CollateSpec(KeyedDataset(50), PadCollate(), SampleMeter(config))
    job = EpochJob(config, 0, 0, 1, list(range(50)))
    run = CollateRunner(spec, job, None, "test/")
    while run.next_batch() is not None:
        pass
    run.close()
    assert run._worker.exitcode == 0 and run.result is not None


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_write_is_named() -> None:
    # Big inline samples leave a killed writer's message half-written in the result pipe.
    loader = odb.ODBLoader(
        BigSamples(),
        token_budget=8,
        num_workers=2,
        prefetch_factor=8,
        window_budgets=1,
        collate_fn=SlowCollate(),
    )
    batches = iter(loader)
    next(batches)
    victim = _writing_worker()
    assert victim is not None, "no worker blocked in a pipe write"
    victim.kill()
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        for _ in batches:
            pass
