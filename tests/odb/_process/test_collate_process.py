"""A forked collate process lets go of its trainer: sockets, signal handlers, thread pool."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import odb
from harness.ranks import run_ranks
from harness.scenarios import LengthDataset

LENGTHS = [(i * 7) % 60 + 1 for i in range(80)]
FORK = {"collate_start_method": "fork"}  # the default on Linux; explicit here


def _collate_process() -> psutil.Process:
    """This trainer's one collate process (its workers are the collate process's children)."""
    children = [
        p for p in psutil.Process().children() if "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert len(children) == 1, children
    return children[0]


def _socket_inodes(proc: psutil.Process) -> set[str]:
    inodes = set()
    for name in os.listdir(f"/proc/{proc.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{proc.pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            inodes.add(target)
    return inodes


def _caught_signals(pid: int) -> set[int]:
    """The signals process ``pid`` has a handler for (``SigCgt`` in its status)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def _sockets_rank(rank: int, world_size: int) -> dict[str, Any]:
    # The trainer's own group has live connections before the loader forks.
    total = torch.ones(1)
    dist.all_reduce(total)
    loader = odb.ODBLoader(LengthDataset(LENGTHS), token_budget=128, num_workers=1, **FORK)
    batches = iter(loader)
    ids = list(odb.pop_step_info(next(batches)).sample_ids)
    child = _collate_process()
    trainer_sockets = _socket_inodes(psutil.Process())
    child_sockets = _socket_inodes(child)
    ids += [i for batch in batches for i in odb.pop_step_info(batch).sample_ids]
    return {
        "start": loader.config.collate_start,
        "trainer": sorted(trainer_sockets),
        "child": sorted(child_sockets),
        "shared": sorted(trainer_sockets & child_sockets),
        "ids": ids,
        "total": float(total[0]),
    }


@pytest.mark.dist
def test_a_forked_collate_process_holds_none_of_the_trainers_sockets() -> None:
    """Else a dead trainer's peers would not see its connections close (the child holds them)."""
    results = run_ranks(_sockets_rank, 2, timeout=120)
    for rank, result in enumerate(results):
        assert result["start"] == "fork"
        assert result["total"] == 2.0
        assert result["trainer"], f"rank {rank}: the trainer has no socket to compare with"
        assert result["shared"] == [], f"rank {rank}: the collate process kept {result}"
    assert sorted(i for r in results for i in r["ids"]) == list(range(len(LENGTHS)))


@pytest.mark.dist
def test_a_forked_collate_process_ignores_the_trainers_signal_handlers(tmp_path: Path) -> None:
    """SIGTERM ends it as it would a fresh process, without running the trainer's handler."""
    marker = tmp_path / "handler-ran"

    def checkpoint_on_term(signum: int, frame: Any) -> None:
        marker.write_text(str(os.getpid()))

    previous = signal.signal(signal.SIGTERM, checkpoint_on_term)
    try:
        # Use the trainer's intra-op pool first: a forked child must not enter it.
        torch.ones(1 << 22).mul_(2).sum()
        loader = odb.ODBLoader(LengthDataset(LENGTHS), token_budget=128, num_workers=1, **FORK)
        batches = iter(loader)
        odb.pop_step_info(next(batches))
        child = _collate_process()
        child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RuntimeError, match="SIGTERM"):
            for batch in batches:
                odb.pop_step_info(batch)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not marker.exists(), f"the trainer's handler ran in process {marker.read_text()}"


@pytest.mark.dist
def test_a_forked_collate_process_keeps_torchs_worker_death_handler() -> None:
    """torch installs its SIGCHLD handler once per process: the child must keep it.

    Without it a worker killed while writing a sample leaves the collate process blocked
    on the half-written message, and the trainer waits forever at world size 1.
    """
    # A plain DataLoader with a worker, in the main thread, installs the handler here.
    assert len(list(DataLoader(list(range(4)), num_workers=1))) == 4
    assert signal.SIGCHLD in _caught_signals(os.getpid())
    loader = odb.ODBLoader(LengthDataset(LENGTHS), token_budget=128, num_workers=1, **FORK)
    batches = iter(loader)
    ids = list(odb.pop_step_info(next(batches)).sample_ids)
    assert signal.SIGCHLD in _caught_signals(_collate_process().pid)
    ids += [i for b in batches for i in odb.pop_step_info(b).sample_ids]
    assert sorted(ids) == list(range(len(LENGTHS)))
