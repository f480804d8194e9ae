"""The Accelerate and DeepSpeed (ZeRO-2) examples on 2 CPU ranks: a checkpoint taken at a
window boundary mid-epoch (model or engine, plus every rank's own loader piece) resumes in
a fresh run that trains each remaining sample once, the same windows on both ranks, and
the progress-driven rate carries on from the checkpoint to 0 at the epoch's end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dist import run_torchrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
SAMPLES = 64  # the examples' default
STOP = 2  # windows before the checkpoint (an epoch of 64 samples has more)


def _run(script: str, record: Path, *args: str) -> list[dict]:
    code, out, err = run_torchrun(
        ROOT / "examples" / script, 2, ["--record", str(record), *args], timeout=240, env=ENV
    )
    assert code == 0, out[-2000:] + err[-4000:]
    return [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("script", ["accelerate_loop.py", "deepspeed_loop.py"])
def test_mid_epoch_checkpoint_resumes_exactly_once(script: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = _run(script, tmp_path / "first", "--checkpoint", str(ckpt), "--stop-after", str(STOP))
    assert sorted(p.name for p in ckpt.glob("loader_rank*.pt")) == [
        "loader_rank0.pt",
        "loader_rank1.pt",
    ]
    resumed = _run(script, tmp_path / "resumed", "--checkpoint", str(ckpt), "--resume")

    for run in (first, resumed):  # both ranks run the same windows in each run
        assert [w["micro"] for w in run[0]["windows"]] == [w["micro"] for w in run[1]["windows"]]
    assert len(first[0]["windows"]) == STOP
    assert len(resumed[0]["windows"]) > 0  # the checkpoint was mid-epoch
    # Every sample of the epoch is trained exactly once over the two runs.
    ids = [i for run in (first, resumed) for r in run for w in r["windows"] for i in w["ids"]]
    assert sorted(ids) == list(range(SAMPLES))
    # The rate carries on from the checkpoint (the first run's next rate) and ends at 0.
    rates = [w["lr"] for w in first[0]["windows"] + resumed[0]["windows"]]
    assert resumed[0]["windows"][0]["lr"] == pytest.approx(first[0]["lr_end"])
    assert 0 < first[0]["lr_end"] < rates[0]
    assert all(r > 0 for r in rates) and rates == sorted(rates, reverse=True)
    assert [r["lr_end"] for r in resumed] == [0.0, 0.0]
