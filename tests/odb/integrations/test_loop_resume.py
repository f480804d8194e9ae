"""The Accelerate, DeepSpeed (ZeRO-2) and FSDP2 examples on CPU ranks, each run as a user runs
it: a checkpoint taken at a window boundary mid-epoch (model or engine, plus every rank's
own loader piece), then a fresh run that resumes from it. Together the two runs show the
examples' guarantees: the same windows on both ranks, every sample of the epoch trained
exactly once, the first window's update (SGD at lr 1) equal to one process's per-token-
mean gradient over its samples, and the progress-driven rate carried on from the
checkpoint to 0 at the epoch's end. DeepSpeed builds no C++ extension on the way. The
FSDP2 example trains two epochs and resumes its sharded checkpoint at W=2 and at W=3."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import examples.tiny as tiny
from harness.torchrun import run_torchrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
SAMPLES = 64  # the examples' default
STOP = 2  # windows before the checkpoint (an epoch of 64 samples has more)


def _run(
    script: str, record: Path, env: dict[str, str], *args: str, world_size: int = 2
) -> list[dict]:
    code, out, err = run_torchrun(
        EXAMPLES / script, world_size, ["--record", str(record), "--lr", "1", *args],
        timeout=240, env=ENV | env,
    )  # fmt: skip
    assert code == 0, out[-2000:] + err[-4000:]
    return [json.loads((record / f"rank{r}.json").read_text()) for r in range(world_size)]


def _assert_first_update_is_the_gradient(windows: list[list[dict]], step1: Path) -> None:
    """The model after the first window (``step1``, SGD at lr 1) moved by exactly the
    gradient of the per-token mean loss over both ranks' first-window samples."""
    dataset, model = tiny.RandomTokens(SAMPLES), tiny.tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = [i for w in windows for i in w[0]["ids"]]
    samples = [dataset[i] for i in ids]
    tokens = sum(int((s["labels"][1:] != -100).sum()) for s in samples)
    for s in samples:
        model(**{k: v[None] for k, v in s.items()}, num_items_in_batch=tokens).loss.backward()
    after = torch.load(step1)
    names = [n for n, p in model.named_parameters() if p.grad is not None]
    update = torch.cat([(before[n] - after[n]).flatten() for n in names]).double()
    ref = torch.cat([dict(model.named_parameters())[n].grad.flatten() for n in names]).double()
    assert torch.linalg.norm(update - ref) / torch.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("script", ["accelerate_loop.py", "deepspeed_loop.py"])
def test_mid_epoch_checkpoint_resumes_exactly_once(script: str, tmp_path: Path) -> None:
    ckpt, extensions = tmp_path / "ckpt", tmp_path / "torch_extensions"
    env = {"TORCH_EXTENSIONS_DIR": str(extensions)}
    first = _run(script, tmp_path / "first", env, "--checkpoint", str(ckpt),
                 "--stop-after", str(STOP))
    assert sorted(p.name for p in ckpt.glob("loader_rank*.pt")) == [
        "loader_rank0.pt",
        "loader_rank1.pt",
    ]
    resumed = _run(script, tmp_path / "resumed", env, "--checkpoint", str(ckpt), "--resume")
    # On CPU, DeepSpeed starts without JIT-compiling any op (the example skips its shm op).
    assert not extensions.exists() or not any(extensions.iterdir())

    for run in (first, resumed):  # both ranks run the same windows in each run
        assert [w["micro"] for w in run[0]["windows"]] == [w["micro"] for w in run[1]["windows"]]
    assert len(first[0]["windows"]) == STOP
    assert len(resumed[0]["windows"]) > 0  # the checkpoint was mid-epoch
    # Every sample of the epoch is trained exactly once over the two runs.
    ids = [i for run in (first, resumed) for r in run for w in r["windows"] for i in w["ids"]]
    assert sorted(ids) == list(range(SAMPLES))
    # The rate starts at --lr, carries on from the checkpoint (the first run's next
    # rate) and ends at 0.
    rates = [w["lr"] for w in first[0]["windows"] + resumed[0]["windows"]]
    assert rates[0] == 1.0
    assert resumed[0]["windows"][0]["lr"] == pytest.approx(first[0]["lr_end"])
    assert 0 < first[0]["lr_end"] < rates[0]
    assert all(r > 0 for r in rates) and rates == sorted(rates, reverse=True)
    assert [r["lr_end"] for r in resumed] == [0.0, 0.0]
    _assert_first_update_is_the_gradient([r["windows"] for r in first],
                                         tmp_path / "first" / "step1.pt")


@pytest.mark.time_budget(120, reason="three launches of the example: W=2, resumed at W=2 and W=3")
def test_fsdp_sharded_checkpoint_resumes_exactly_once_at_another_world_size(
    tmp_path: Path,
) -> None:
    """Two epochs at W=2, a checkpoint mid-way through the first; resumed at W=2 and at
    W=3 from the same folder, each finishes both epochs with every sample once per epoch,
    the resharded model is the saved one and the rate carries on."""
    ckpt, args = tmp_path / "ckpt", ("--epochs", "2")
    first = _run("fsdp_loop.py", tmp_path / "first", {}, *args, "--checkpoint", str(ckpt),
                 "--stop-after", str(STOP))  # fmt: skip
    assert [len(r["windows"]) for r in first] == [STOP, STOP]
    assert sorted(p.name for p in (ckpt / "loader").iterdir()) == ["rank0.pt", "rank1.pt"]
    _assert_first_update_is_the_gradient([r["windows"] for r in first],
                                         tmp_path / "first" / "step1.pt")  # fmt: skip
    for world_size in (2, 3):
        resumed = _run("fsdp_loop.py", tmp_path / f"resumed{world_size}", {}, *args,
                       "--checkpoint", str(ckpt), "--resume", world_size=world_size)  # fmt: skip
        assert len({json.dumps([w["micro"] for w in r["windows"]]) for r in resumed}) == 1
        for epoch in (0, 1):  # every sample exactly once per epoch, over the two runs
            ids = [i for run in (first, resumed) for r in run for w in r["windows"]
                   if w["epoch"] == epoch for i in w["ids"]]  # fmt: skip
            assert sorted(ids) == list(range(SAMPLES)), (world_size, epoch)
        # DCP resharded the saved model onto W ranks: the same full parameters.
        for r in resumed:
            assert r["resumed_norm"] == pytest.approx(first[0]["saved_norm"], rel=1e-12)
        windows = resumed[0]["windows"]
        assert windows[0]["epoch"] == 0  # the checkpoint was mid-epoch
        assert windows[0]["lr"] == pytest.approx(first[0]["lr_end"])
        rates = [w["lr"] for w in first[0]["windows"] + windows]
        assert rates == sorted(rates, reverse=True) and resumed[0]["lr_end"] == 0.0
        losses = {e: [w["loss"] for w in first[0]["windows"] + windows if w["epoch"] == e]
                  for e in (0, 1)}  # fmt: skip
        assert all(math.isfinite(x) for e in (0, 1) for x in losses[e])
        assert sum(losses[1]) / len(losses[1]) < sum(losses[0]) / len(losses[0])
