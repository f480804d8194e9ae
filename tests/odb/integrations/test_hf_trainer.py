"""ODBTrainer on 2 real ranks (torchrun, Gloo): the exact first-step gradient under DDP and
DeepSpeed ZeRO-2, IDLE steps, two epochs with the schedule ending at the data's end, and
a mid-epoch checkpoint that resumes exactly once; a one-epoch run whose progress bar
ends at 100% (rank script and checks: hf_ranks.py); and, in this process, how it moves
an ``odb.TensorParts`` field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import odb
from tests.odb.integrations.hf_ranks import (
    EPOCH_SAMPLES,
    check_bar_ends_at_100,
    check_epochs_and_resume,
    check_first_step_gradient,
    run,
)
from tests.odb.integrations.tiny import TokenDataset, tiny_model

pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed"])
def test_first_step_gradient_is_the_global_per_token_mean(strategy: str, tmp_path: Path) -> None:
    check_first_step_gradient(tmp_path, strategy)


def test_epochs_schedule_and_mid_epoch_resume_exactly_once(tmp_path: Path) -> None:
    check_epochs_and_resume(tmp_path, "ddp")


def test_one_epoch_progress_bar_ends_at_100_percent(tmp_path: Path) -> None:
    """The Trainer is sized by an upper bound of steps; the bar's total follows the
    loader's estimate and ends equal to the steps taken, the schedule still ends at 0."""
    ranks = run(tmp_path, "epoch", "ddp", "--epochs", "1")
    check_bar_ends_at_100(ranks)
    steps = ranks[0]["steps"]
    assert sorted(i for r in ranks for s in r["steps"] for i in s["ids"]) == list(
        range(EPOCH_SAMPLES)
    )
    rates = [s["lr_next"] for s in steps]
    assert rates[-1] == 0.0 and all(r > 0 for r in rates[:-1])
    assert steps[-1]["epoch"] == pytest.approx(1.0)


class _LowEstimateLoader(odb.ODBLoader):
    """Says one batch is left in the epoch: the lowest estimate the step total can get."""

    def estimate_steps(self) -> int | None:
        return 1


def test_a_low_step_estimate_never_stops_training_before_the_data_ends(tmp_path: Path) -> None:
    """The step total is the steps done + 1 after every step here; the Trainer's own stop
    (global_step >= max_steps) must not fire while the loader has windows left."""
    from transformers import TrainerCallback, TrainingArguments

    from odb.integrations.hf_trainer import ODBTrainer

    class Ids(TrainerCallback):
        def __init__(self) -> None:
            self.ids: list[int] = []

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            self.ids += [i for info in trainer.window_infos for i in info.sample_ids]

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, ignore_data_skip=True, report_to=[],
        disable_tqdm=True, num_train_epochs=1, gradient_accumulation_steps=2,
        save_strategy="no", optim="sgd", learning_rate=0.01,
    )  # fmt: skip
    dataset = TokenDataset(24, 8, 48, seed=1)
    loader = _LowEstimateLoader(dataset, token_budget=96, grad_accum_steps=2, collate_mode="thread")
    recorder = Ids()
    trainer = ODBTrainer(model=tiny_model(), args=args, train_loader=loader, callbacks=[recorder])
    trainer.train()
    assert sorted(recorder.ids) == list(range(len(dataset)))
    assert trainer.state.global_step >= 3  # more windows than the estimate's one left
    assert trainer.state.max_steps == trainer.state.global_step  # exact at the end


def test_prepare_inputs_turns_tensor_parts_into_one_tensor(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from odb.integrations.hf_trainer import ODBTrainer

    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        ignore_data_skip=True,
        report_to=[],
        disable_tqdm=True,
    )
    loader = odb.ODBLoader(TokenDataset(4, 8, 16), token_budget=64, collate_mode="thread")
    trainer = ODBTrainer(model=tiny_model(), args=args, train_loader=loader)
    parts = [torch.randn(3, 4), torch.randn(2, 4)]
    inputs = trainer._prepare_inputs({"pixel_values": odb.batch_parts(parts), "n": [1]})
    assert isinstance(inputs["pixel_values"], torch.Tensor)
    assert torch.equal(inputs["pixel_values"], torch.cat(parts)) and inputs["n"] == [1]
