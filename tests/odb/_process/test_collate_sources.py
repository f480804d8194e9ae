"""An epoch that ends early receives what its DataLoader workers owe (``receive_owed``).

Under ``file_system`` sharing a worker takes a reference on each shared segment of an
item as it pickles it; only the receiver's unpickling returns it. Before the fix, the
items a worker had sent for a ``break`` or ``close()`` that came before them kept their
segments in ``/dev/shm`` until the rank's last process ended (the repeat campaign met
it as a soak leak, issue 56). Each test waits until the worker has fetched every item it
was asked for and is idle, so on the unfixed code those items were in flight every time.
Each runs in a forked child: the sharing strategy and its manager end with it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

import odb
from harness.shm_audit import ShmAudit
from tests.forked import run_forked

# A storage above odb._process.pickling._INLINE_MAX_BYTES travels as a shared segment in
# process mode too (smaller ones travel inside the pickle).
_LENGTH = {"thread": 5, "process": 40_000}


class _MarkedDataset(torch.utils.data.Dataset):
    """Items of ``length`` tokens; each read leaves a file named after its index."""

    def __init__(self, marks: Path, length: int) -> None:
        self.marks, self.length = marks, length

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        (self.marks / str(i)).touch()
        ids = torch.arange(self.length + i % 3)
        return {"input_ids": ids, "labels": ids.clone()}


def _wait_until_idle(marks: Path) -> int:
    """The reads so far, once no read has come for a second (the worker is waiting)."""
    seen, since = -1, time.monotonic()
    while time.monotonic() - since < 1.0:
        now = len(list(marks.iterdir()))
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.05)
    return seen


def _break_early(marks: str, mode: str) -> dict[str, Any]:
    torch.multiprocessing.set_sharing_strategy("file_system")
    length = _LENGTH[mode]
    dataset = _MarkedDataset(Path(marks), length)
    with ShmAudit() as shm:
        loader = odb.ODBLoader(
            dataset,
            token_budget=3 * length,
            collate_fn=odb.PadCollate(),
            num_workers=1,
            collate_mode=mode,
        )
        batches = iter(loader)
        taken = [next(batches) for _ in range(2)]
        reads = _wait_until_idle(Path(marks))
        del batches, taken
        loader.close()
        return {"reads": reads, "leaked": sorted(shm.leaked(settle_s=3))}


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_break_returns_the_segments_of_items_in_flight(tmp_path: Path, mode: str) -> None:
    found = run_forked(_break_early, str(tmp_path), mode)
    assert found["reads"] > 4  # two batches of two or three, and the items in flight
    assert found["leaked"] == []
