"""A 2-rank loop SIGKILLed mid-epoch and restarted from its last checkpoint sees every
sample of the epoch exactly once (ids yielded after the checkpoint are owed again)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch

from harness.torchrun import run_torchrun
from odb.core.resume import merge_pieces, parse_pieces
from tests.odb.kill_resume_script import LENGTHS

pytestmark = pytest.mark.dist
SCRIPT = Path(__file__).with_name("kill_resume_script.py")
ROOT = str(Path(__file__).parents[2])


def _ids(path: Path) -> list[int]:
    return [int(t) for line in path.read_text().splitlines() for t in line.split()]


def _alive(tmp_path: Path, err: str) -> list[int]:
    """Children (collate process, workers) the killed run's ranks recorded, still alive;
    ``err``, the killed run's stderr, says why when no rank reached its first batch."""
    pids = [int(p) for f in tmp_path.glob("children_kill_*.txt") for p in f.read_text().split()]
    assert pids, f"no rank of the killed run had a batch; its stderr:\n{err[-3000:]}"
    return [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def test_sigkill_then_resume_is_exactly_once(tmp_path: Path) -> None:
    code, _, err = run_torchrun(
        SCRIPT, 2, [str(tmp_path), "kill"], timeout=150, env={"PYTHONPATH": ROOT}
    )
    assert code != 0, "the killed run must fail"
    deadline = time.monotonic() + 15
    while _alive(tmp_path, err) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(tmp_path, err) == [], "processes of the killed run were left behind"
    pieces = [torch.load(p, weights_only=False) for p in sorted(tmp_path.glob("ckpt_*.pt"))]
    assert len(pieces) == 2, "each rank saves its own piece"
    consumed = merge_pieces(parse_pieces(pieces)).consumed
    before = _ids(tmp_path / "ids_kill_0.txt") + _ids(tmp_path / "ids_kill_1.txt")
    assert set(consumed) <= set(before) and len(consumed) == len(set(consumed)) > 0

    code, _, err = run_torchrun(
        SCRIPT, 2, [str(tmp_path), "resume"], timeout=150, env={"PYTHONPATH": ROOT}
    )
    assert code == 0, err[-3000:]
    after = _ids(tmp_path / "ids_resume_0.txt") + _ids(tmp_path / "ids_resume_1.txt")
    assert sorted(list(consumed) + after) == list(range(len(LENGTHS)))
