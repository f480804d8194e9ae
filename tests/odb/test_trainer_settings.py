"""ODB under the settings a trainer already has before it builds a loader (issue 31).

Each setting of ``tests/odb/trainer_settings_script.py`` (``file_system`` sharing, a
global start method of the user's, ``pin_memory``, busy background threads, thread
counts) is run with the default forked collate process and with a collate thread, one
at a time; a spawned collate process inherits none of them but the environment and the
start method, so one run with all of them at once covers it (spawned interpreters are
the expensive part of this file). The ranks are started as ``torch.multiprocessing.spawn``
starts them (``harness.ranks.run_ranks``) and by ``torchrun``. Every run must yield every
sample exactly once over the ranks.

The issue's snippet (``set_sharing_strategy("file_system")``, then a loader with default
settings) is checked at W = 1 here, with the hand-off's guarantees (views of shared
memory, freed when the trainer lets go, nothing left in ``/dev/shm``), and at W = 2 (in
the matrix) and W = 4.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import odb
from harness.ranks import run_ranks
from harness.shm_audit import ShmAudit, held_shm, mapped_file, shm_entries
from harness.torchrun import run_torchrun
from tests.forked import run_forked
from tests.odb.trainer_settings_script import (
    COLLATE,
    LENGTHS,
    SETTINGS,
    TORCHRUN_COLLATE,
    run_settings,
)
from tests.shm_manager import connected_manager, paused_manager

SCRIPT = Path(__file__).with_name("trainer_settings_script.py")
START_METHODS = ["start_method_spawn", "start_method_forkserver"]
OTHERS = [s for s in SETTINGS if s not in START_METHODS]
# One setting at a time, forked collate process and collate thread (a thread's workers
# under the user's start method are the stacked runs' job: each spawn costs seconds).
SINGLE = [([s], "fork") for s in SETTINGS] + [([s], "thread") for s in OTHERS]
STACKED = [
    (OTHERS + ["start_method_spawn"], "fork"),
    (OTHERS + ["start_method_forkserver"], "spawn"),
    (OTHERS + ["start_method_spawn"], "forkserver"),
    (OTHERS + ["start_method_spawn"], "thread"),
]


def _check_every_sample_once(per_rank: list[dict[str, dict[str, Any]]]) -> None:
    for name in per_rank[0]:
        runs = [ranks[name] for ranks in per_rank]  # a run's error was raised in its rank
        ids = sorted(i for run in runs for i in run["ids"])
        assert ids == list(range(len(LENGTHS))), f"{name}: samples lost or repeated: {ids}"


@pytest.mark.dist
def test_every_setting_trains_each_sample_once_on_spawned_ranks(tmp_path: Path) -> None:
    per_rank = run_ranks(run_settings, 2, SINGLE + STACKED, str(tmp_path), timeout=240)
    assert len(per_rank[0]) == len(SINGLE + STACKED)
    _check_every_sample_once(per_rank)


@pytest.mark.dist
def test_file_system_sharing_trains_each_sample_once_under_torchrun(tmp_path: Path) -> None:
    code, out, err = run_torchrun(
        SCRIPT,
        2,
        [str(tmp_path), "sharing_file_system"],
        timeout=180,
        env={"PYTHONPATH": str(SCRIPT.parents[2])},
    )
    assert code == 0, err[-3000:]
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(per_rank[0]) == [f"sharing_file_system/{c}" for c in sorted(TORCHRUN_COLLATE)]
    _check_every_sample_once(per_rank)


def _snippet(rank: int, world_size: int) -> list[int]:
    """The issue's snippet on one rank: file_system sharing, default loader settings."""
    torch.multiprocessing.set_sharing_strategy("file_system")
    loader = odb.ODBLoader(
        _Dataset(), token_budget=2048, collate_fn=odb.PadCollate(), num_workers=2
    )
    return [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]


class _Dataset:
    """Map-style, dict samples; long enough that every one of 4 ranks gets several."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(index % 50 + 1)
        return {"input_ids": ids, "labels": ids.clone()}


@pytest.mark.dist
def test_the_issue_snippet_trains_each_sample_once_at_four_ranks() -> None:
    per_rank = run_ranks(_snippet, 4, timeout=180)
    assert sorted(i for ids in per_rank for i in ids) == list(range(64))


def _snippet_with_the_handoffs_guarantees(collate: str) -> None:
    with ShmAudit() as shm:
        _the_handoffs_guarantees(shm, collate)


def _the_handoffs_guarantees(shm: ShmAudit, collate: str) -> None:
    before = shm_entries()
    torch.multiprocessing.set_sharing_strategy("file_system")
    loader = odb.ODBLoader(
        _Dataset(), token_budget=256, collate_fn=odb.PadCollate(), num_workers=2, **COLLATE[collate]
    )
    kept = list(loader)  # the trainer keeps every batch
    ids = sorted(i for batch in kept for i in odb.pop_step_info(batch).sample_ids)
    assert ids == list(range(64))
    # No copy: every batch is a view of a block mapped from shared memory.
    mapped = [mapped_file(batch["input_ids"].untyped_storage().data_ptr()) for batch in kept]
    assert all(name.startswith("/dev/shm/") for name in mapped), mapped
    del loader
    gc.collect()
    held = _torch_segments_held() - before
    assert held, "the kept batches hold no shared memory"
    if collate == "fork":  # from a spawned child, a name may go while the trainer maps it
        assert held <= shm_entries(), "file_system segments keep their names while held"
    kept.clear()
    gc.collect()
    # Freed when the trainer lets go; nothing left for torch_shm_manager to unlink (a
    # spawned or forkserver collate process maps the heartbeat from its pickle: it
    # frees it before it ends, else its name stays while the trainer lives).
    assert not _torch_segments_held() - before
    assert not shm.leaked()


def _torch_segments_held() -> set[str]:
    """torch's shared-memory segments this process maps or holds open."""
    return {name for name in held_shm([os.getpid()]) if name.startswith("torch_")}


@pytest.mark.dist
@pytest.mark.parametrize("collate", ["fork", "spawn", "forkserver"])
def test_the_issue_snippet_trains_at_one_rank_with_the_handoffs_guarantees(collate: str) -> None:
    """file_system sharing, default settings but the collate process's start, W = 1.

    In a forked child (``tests.forked``): the strategy's torch_shm_manager goes with it.
    """
    run_forked(_snippet_with_the_handoffs_guarantees, collate)


def _a_paused_manager_at_the_start(collate: str) -> list[int]:
    pid = connected_manager()  # the trainer shared a tensor before: its manager
    loader = odb.ODBLoader(
        _Dataset(), token_budget=256, collate_fn=odb.PadCollate(), **COLLATE[collate]
    )
    with paused_manager(pid, resume_after_s=3.0):
        return sorted(i for batch in loader for i in odb.pop_step_info(batch).sample_ids)


@pytest.mark.dist
@pytest.mark.parametrize("collate", ["fork", "spawn", "forkserver"])
def test_a_busy_shm_manager_at_the_collate_start_fails_nothing(collate: str) -> None:
    """Issue 56: beside two busy processes a forkserver collate process died unpickling
    its start arguments, its shared heartbeat's registration with torch_shm_manager
    timed out (libshm waits one second). Reproduced by pausing the manager past that
    second while the loader starts: nothing of ODB's start needs the manager now, and
    its blocks wait for it (``odb._process.torch_shm``)."""
    assert run_forked(_a_paused_manager_at_the_start, collate) == list(range(64))


# A lock of the trainer's that its metrics thread holds while it writes; the dataset
# takes it too (a shared logger, a file, a cache). Module level, as such locks are.
_METRICS_LOCK = threading.Lock()


class _LockingDataset(_Dataset):
    """Takes the trainer's lock in every ``__getitem__``; says whether it could.

    A lock held by another thread at a fork stays held forever in the child (nothing
    there will release it); a real dataset would wait on it forever. This one waits a
    moment and records the answer, so the test can compare without hanging.
    """

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        took = _METRICS_LOCK.acquire(timeout=0.01)
        if took:
            _METRICS_LOCK.release()
        sample = super().__getitem__(index)
        sample["lock_free"] = torch.tensor([took])
        return sample


def _lock_free_samples(batches: Any) -> list[bool]:
    return [bool(flag) for batch in batches for flag in batch["lock_free"].flatten()]


@pytest.mark.dist
@pytest.mark.parametrize("collate_mode", ["process", "thread"])
def test_a_lock_held_at_the_fork_is_pythons_hazard_and_odb_does_no_worse(
    collate_mode: str,
) -> None:
    """The hazard of forking a process with busy threads is Python's own.

    A lock that another trainer thread holds at the fork is held forever in the child
    (CPython re-initialises only its own and ``logging``'s locks). A plain DataLoader's
    forked workers inherit it held; so do ODB's forked children (the collate process,
    and workers forked from it or, in thread mode, from the trainer). ODB's own code in
    the child takes none of the trainer's locks, and with the lock free at the fork both
    see it free. ``collate_start_method="spawn"`` avoids the hazard (docs/reliability.md).
    """
    odb_options = {"collate_mode": collate_mode, "num_workers": 1}
    plain = DataLoader(_LockingDataset(), batch_size=None, num_workers=1)
    assert all(_lock_free_samples(plain))
    loader = odb.ODBLoader(_LockingDataset(), token_budget=256, **odb_options)
    assert all(_lock_free_samples(loader))
    with _metrics_thread_writing():
        plain = DataLoader(_LockingDataset(), batch_size=None, num_workers=1)
        assert not any(_lock_free_samples(plain))
        loader = odb.ODBLoader(_LockingDataset(), token_budget=256, **odb_options)
        outcome = _lock_free_samples(loader)
    assert len(outcome) == 16 and not any(outcome)  # the same as the DataLoader's workers


@contextlib.contextmanager
def _metrics_thread_writing() -> Iterator[None]:
    """A trainer thread holds ``_METRICS_LOCK`` throughout (a long write)."""
    holding, done = threading.Event(), threading.Event()

    def write() -> None:
        with _METRICS_LOCK:
            holding.set()
            done.wait()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    holding.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()
