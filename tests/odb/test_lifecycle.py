"""Loader lifecycle: break, re-iterate, interpreter exit with a live iterator, no leftovers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import odb
from harness.scenarios import LengthDataset

ROOT = Path(__file__).parents[2]


def _is_loader_child(proc: psutil.Process) -> bool:
    """A live child other than multiprocessing's resource tracker (one per program)."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return "resource_tracker" not in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False


def _live_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if _is_loader_child(p)]


def _children_settle(timeout_s: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = _live_children()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.dist
@pytest.mark.parametrize(
    ("mode", "start"),
    [("thread", None), ("process", None), ("process", "spawn")],
    ids=["thread", "process-forked", "process-spawned"],
)
def test_break_then_full_epochs_leave_no_children(mode: str, start: str | None) -> None:
    loader = odb.ODBLoader(
        LengthDataset([(i % 13) + 1 for i in range(120)]),
        token_budget=32,
        collate_mode=mode,
        collate_start_method=start,
        num_workers=1,
        queue_depth=2,
    )
    for step, batch in enumerate(loader):
        odb.pop_step_info(batch)
        if step == 3:
            break
    # The abandoned epoch's collate process (and worker) is stopped, not reused.
    assert _children_settle() == []
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        ids = sorted(i for b in loader for i in odb.pop_step_info(b).sample_ids)
        assert ids == list(range(120))
        # Its workers have exited before the epoch's end reached us.
        kept.append([p.pid for p in _live_children()])
    # Between epochs only the idle collate process lives, the same one every epoch.
    assert kept == [kept[0]] * 3 and len(kept[0]) == (mode == "process"), kept
    del loader, batch  # the loader's collate process ends with it
    assert _children_settle() == []


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_reiterating_after_a_break_yields_only_the_new_epoch(mode: str) -> None:
    # An iterator abandoned mid-epoch, then iter() again at once (the old iterator still
    # referenced): the new epoch yields its own samples, each once, never stale batches.
    loader = odb.ODBLoader(
        LengthDataset([(i % 13) + 1 for i in range(90)]),
        token_budget=32,
        collate_mode=mode,
        num_workers=1,
        queue_depth=1,
    )
    old = iter(loader)
    first = odb.pop_step_info(next(old))
    loader.set_epoch(1)
    infos = [odb.pop_step_info(b) for b in loader]
    assert sorted(i for info in infos for i in info.sample_ids) == list(range(90))
    assert {info.epoch for info in infos} == {1} and first.epoch == 0
    del old
    loader.set_epoch(2)  # and the loader keeps working after the old one is gone
    assert sorted(i for b in loader for i in odb.pop_step_info(b).sample_ids) == list(range(90))


@pytest.mark.dist
def test_exit_with_live_iterator_does_not_hang() -> None:
    script = textwrap.dedent("""
        import odb
        from harness.scenarios import LengthDataset
        if __name__ == "__main__":
            loader = odb.ODBLoader(LengthDataset([5] * 100), token_budget=16, num_workers=1)
            it = iter(loader)
            next(it)
            print("left with a live iterator", flush=True)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "left with a live iterator" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.dist
def test_a_collate_process_killed_between_epochs_is_replaced_with_a_warning() -> None:
    loader = odb.ODBLoader(LengthDataset([(i % 13) + 1 for i in range(60)]), token_budget=32)
    assert sum(odb.pop_step_info(b).local_samples for b in loader) == 60
    (idle,) = _live_children()
    idle.kill()  # the OOM killer, while no epoch runs
    # Until every thread of it has exited, the kernel does not report it as ended (its
    # main thread shows as a zombie before that); multiprocessing reaps it then.
    deadline = time.monotonic() + 10
    while idle.pid in {p.pid for p in multiprocessing.active_children()}:
        assert time.monotonic() < deadline, "the killed collate process did not end"
        time.sleep(0.05)
    loader.set_epoch(1)
    with pytest.warns(RuntimeWarning, match=r"exited between epochs \(exit code -9\)"):
        assert sum(odb.pop_step_info(b).local_samples for b in loader) == 60
    (fresh,) = _live_children()
    assert fresh.pid != idle.pid
    del loader
    assert _children_settle() == []


@pytest.mark.dist
def test_start_brings_up_the_collate_process_the_first_epoch_uses() -> None:
    loader = odb.ODBLoader(LengthDataset([(i % 13) + 1 for i in range(60)]), token_budget=32)
    assert _live_children() == []
    loader.start()
    loader.start()  # idempotent
    (early,) = _live_children()
    assert sum(odb.pop_step_info(b).local_samples for b in loader) == 60
    (after,) = _live_children()
    assert after.pid == early.pid
    del loader
    assert _children_settle() == []
