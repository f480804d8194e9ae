"""ODBSFTTrainer (TRL's SFTTrainer with ODB batches) on 2 real ranks (torchrun, Gloo): the
example trains; the exact first-step gradient with an IDLE step, on data TRL labels from
a completion mask; two epochs over a mid-epoch checkpoint and resume, every sample once
per epoch, the schedule to 0 and the progress bar to 100% (rank script and checks:
hf_ranks.py, shared with ODBTrainer's tests); and the TRL settings it refuses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import odb
from harness.torchrun import run_torchrun
from tests.odb.integrations.hf_ranks import (
    ENV,
    ROOT,
    check_epochs_and_resume,
    check_first_step_gradient,
)
from tests.odb.integrations.test_examples import _logged_dicts


@pytest.mark.dist
@pytest.mark.slow
def test_example_trains_on_two_ranks(tmp_path: Path) -> None:
    args = ["--samples", "16", "--out", str(tmp_path)]
    code, out, err = run_torchrun(ROOT / "examples" / "trl_sft.py", 2, args, timeout=240, env=ENV)
    assert code == 0, out[-2000:] + err[-4000:]
    losses = [float(d["loss"]) for d in _logged_dicts(out) if "loss" in d]
    assert losses and all(math.isfinite(x) and x > 0 for x in losses), out[-2000:]


@pytest.mark.dist
@pytest.mark.slow
def test_first_step_gradient_is_the_global_per_token_mean(tmp_path: Path) -> None:
    check_first_step_gradient(tmp_path, "trl")


@pytest.mark.dist
@pytest.mark.slow
def test_epochs_schedule_and_mid_epoch_resume_exactly_once(tmp_path: Path) -> None:
    check_epochs_and_resume(tmp_path, "trl")


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"packing": True}, "packing=True"), ({"padding_free": True}, "padding_free=True")],
)
def test_refuses_trl_settings_that_cannot_hold_with_odb(
    setting: dict, named: str, tmp_path: Path
) -> None:
    from trl import SFTConfig

    from odb.integrations.trl import ODBSFTTrainer

    args = SFTConfig(str(tmp_path), use_cpu=True, bf16=False, report_to=[], **setting)
    with pytest.raises(ValueError, match=named):
        ODBSFTTrainer(model=None, args=args, odb_config=odb.ODBConfig(token_budget=64))


def test_refuses_an_ignore_index_trl_does_not_use(tmp_path: Path) -> None:
    from trl import SFTConfig

    from odb.integrations.trl import ODBSFTTrainer

    args = SFTConfig(str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    config = odb.ODBConfig(token_budget=64, ignore_index=-1)
    with pytest.raises(ValueError, match="ignore_index=-1"):
        ODBSFTTrainer(model=None, args=args, odb_config=config)
