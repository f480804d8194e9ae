"""Same guarantees under torchrun and mp.spawn, with two loaders alive in one process.

A peer implementation loses its cross-rank sync under ``spawn`` and crashes with a
second loader; both are checked here on real ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ranks import run_ranks
from harness.torchrun import run_torchrun
from tests.odb.two_loaders_script import EVAL_LENGTHS, TRAIN_LENGTHS, two_loaders

pytestmark = pytest.mark.dist
SCRIPT = Path(__file__).with_name("two_loaders_script.py")


def _check(per_rank: list[dict[str, list]]) -> None:
    for name, lengths in (("train", TRAIN_LENGTHS), ("eval", EVAL_LENGTHS)):
        for epoch in range(2):
            steps = [r[name][epoch] for r in per_rank]
            assert len({len(s) for s in steps}) == 1, f"{name} epoch {epoch}: step counts differ"
            ids = sorted(i for s in steps for group in s for i in group)
            assert ids == list(range(len(lengths))), f"{name} epoch {epoch}: ids lost/duplicated"


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_spawned_ranks_two_loaders(mode: str) -> None:
    _check(run_ranks(two_loaders, 3, mode, timeout=180))


def test_torchrun_two_loaders(tmp_path: Path) -> None:
    code, out, err = run_torchrun(
        SCRIPT,
        2,
        ["process", str(tmp_path)],
        timeout=180,
        env={"PYTHONPATH": str(SCRIPT.parents[2])},
    )
    assert code == 0, err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json"], out[-2000:]
    _check([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)])
