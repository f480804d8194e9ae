"""ODBTrainer and ODBSFTTrainer on real ranks, and the checks of what they record.

Run under torchrun by test_hf_trainer.py and test_trl.py; one JSON per rank:

    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py grad ddp OUT
    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py epoch ddp OUT --stop K
    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py epoch ddp OUT --resume
    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py epoch trl OUT --epochs 1

Strategies: ``ddp`` and ``deepspeed`` (ZeRO-2) train ``ODBTrainer``; ``trl`` trains
``ODBSFTTrainer`` (DDP) on the same samples given to TRL tokenised, as ``input_ids`` and
a ``completion_mask`` from which TRL builds the labels.

``grad``: 3 samples that never share a group, grad_accum 2, SGD lr 1, one optimizer step:
rank 0 trains two samples, rank 1 one sample and one IDLE step; rank 0 saves the
parameters after the step. ``epoch``: 40 samples, grad_accum 3 (so a window is cut
short at the epoch's end), linear schedule to 0 over ``--epochs`` (2), a checkpoint every
2 steps, the Trainer's progress bar on; ``--stop K`` ends the run after step K's
checkpoint, ``--resume`` continues from the newest checkpoint.

The ``check_*`` functions are the tests' assertions over those records, shared by the
trainers' tests.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import ProgressCallback, TrainerCallback, TrainingArguments

import odb
from harness.torchrun import run_torchrun, without_progress_bars
from odb.integrations.deepspeed import skip_cpu_shm_comm_build
from odb.integrations.hf_trainer import ODBTrainer
from tests.odb.integrations.tiny import (
    TokenDataset,
    completion_dataset,
    reference_grads,
    tiny_model,
    tiny_tokenizer,
)

SCRIPT = Path(__file__)
ROOT = SCRIPT.parents[3]
# No hub: TRL's telemetry and the Trainer's model card stay offline.
ENV = {
    "PYTHONPATH": str(ROOT),
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
GRAD_DATASET = (3, 40, 60)  # TokenDataset(n, lo, hi) of the grad mode
EPOCH_SAMPLES = 40
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 2**31 - 1,
}


class Recorder(TrainerCallback):
    """Per optimizer step: this rank's windows (ids, idle) and the next step's rate; at
    each epoch's end, the Trainer's progress bar (rank 0)."""

    def __init__(self, trainer: ODBTrainer, stop: int | None) -> None:
        self.trainer, self.stop, self.steps, self.bars = trainer, stop, [], []

    def on_step_end(self, args, state, control, **kwargs):
        infos = self.trainer.window_infos
        self.steps.append(
            {
                "step": state.global_step,
                "ids": [i for info in infos for i in info.sample_ids],
                "micro": len(infos),
                "idle": sum(info.idle for info in infos),
                "lr_next": self.trainer.optimizer.param_groups[0]["lr"],
                "epoch": state.epoch,
                "data_epoch": infos[0].epoch,
                "max_steps": state.max_steps,
            }
        )
        if self.stop is not None and state.global_step >= self.stop:
            control.should_training_stop = True

    def on_epoch_end(self, args, state, control, **kwargs):
        for callback in self.trainer.callback_handler.callbacks:
            bar = getattr(callback, "training_bar", None)
            if isinstance(callback, ProgressCallback) and bar is not None:
                self.bars.append({"n": bar.n, "total": bar.total, "step": state.global_step})


def build_trainer(opt: argparse.Namespace) -> ODBTrainer:
    """The trainer of ``opt.mode`` and ``opt.strategy`` (see the module docstring)."""
    grad = opt.mode == "grad"
    accum = 2 if grad else 3
    common = dict(
        output_dir=str(opt.out / "run"),
        use_cpu=opt.strategy != "deepspeed",
        gradient_accumulation_steps=accum,
        ignore_data_skip=True,
        optim="sgd",
        learning_rate=1.0 if grad else 0.05,
        lr_scheduler_type="constant" if grad else "linear",
        max_steps=1 if grad else -1,
        num_train_epochs=1 if grad else opt.epochs,
        max_grad_norm=0.0,
        save_strategy="no" if grad else "steps",
        save_steps=2,
        logging_steps=1,
        report_to=[],
        disable_tqdm=grad,  # the epoch runs check the progress bar
        seed=0,
        ddp_backend="gloo",
    )
    # 3 samples of 40-60 tokens under a 64-token budget: every group is one sample.
    dataset = TokenDataset(*GRAD_DATASET) if grad else TokenDataset(EPOCH_SAMPLES, 8, 48, seed=1)
    options = dict(
        token_budget=64 if grad else 96,
        grad_accum_steps=accum,
        collate_mode="thread",
        shuffle=not grad,
    )
    if opt.strategy == "trl":
        from trl import SFTConfig

        from odb.integrations.trl import ODBSFTTrainer

        args = SFTConfig(
            **common, bf16=False, gradient_checkpointing=False, completion_only_loss=True
        )
        return ODBSFTTrainer(
            model=tiny_model(),
            args=args,
            train_dataset=completion_dataset(dataset),
            processing_class=tiny_tokenizer(),
            odb_config=odb.ODBConfig(**options),
        )
    deepspeed = DS_CONFIG if opt.strategy == "deepspeed" else None
    if deepspeed:
        skip_cpu_shm_comm_build()
    args = TrainingArguments(**common, deepspeed=deepspeed)
    loader = odb.ODBLoader(dataset, **options)
    return ODBTrainer(model=tiny_model(), args=args, train_loader=loader)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["grad", "epoch"])
    parser.add_argument("strategy", choices=["ddp", "deepspeed", "trl"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop", type=int)
    parser.add_argument("--resume", action="store_true")
    opt = parser.parse_args()
    trainer = build_trainer(opt)
    recorder = Recorder(trainer, opt.stop)
    trainer.add_callback(recorder)
    trainer.train(resume_from_checkpoint=True if opt.resume else None)
    rank = int(os.environ["RANK"])  # (HF reports world size 1 under DeepSpeed on CPU)
    if opt.mode == "grad" and rank == 0:
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        torch.save(params, opt.out / "params.pt")
    tag = "resume" if opt.resume else "first"
    result = {
        "steps": recorder.steps,
        "bars": recorder.bars,
        "max_steps": trainer.state.max_steps,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "lr_final": trainer.optimizer.param_groups[0]["lr"],
    }
    (opt.out / f"{tag}_rank{rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------- checks


def run(out: Path, mode: str, strategy: str, *args: str) -> list[dict]:
    """Run this script at W=2; each rank's record (``first``, or ``resume``)."""
    code, stdout, err = run_torchrun(
        SCRIPT, 2, [mode, strategy, str(out), *args], timeout=240, env=ENV
    )
    assert code == 0, f"exit code {code}\n{stdout[-2000:]}\n{without_progress_bars(err)[-6000:]}"
    tag = "resume" if "--resume" in args else "first"
    return [json.loads((out / f"{tag}_rank{r}.json").read_text()) for r in (0, 1)]


def check_first_step_gradient(out: Path, strategy: str) -> None:
    """The ``grad`` run's update (SGD at lr 1) is one process's per-token-mean gradient."""
    steps = [r["steps"] for r in run(out, "grad", strategy)]
    assert [len(s) for s in steps] == [1, 1]  # max_steps=1
    # Rank 0 trains two samples, rank 1 one sample and one IDLE step, in one window.
    assert sorted((s[0]["micro"], s[0]["idle"]) for s in steps) == [(2, 0), (2, 1)]
    ids = sorted(i for s in steps for i in s[0]["ids"])
    assert ids == [0, 1, 2]

    dataset = TokenDataset(*GRAD_DATASET)
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference = reference_grads(model, [dataset[i] for i in ids])
    after = torch.load(out / "params.pt")
    update = torch.cat([(before[n] - after[n]).flatten() for n in reference]).double()
    ref = torch.cat([g.flatten() for g in reference.values()]).double()
    # SGD at lr 1: the update is the gradient; a second normalisation would halve or
    # double it (W=2), a per-rank mean would weight rank 1's single sample twice.
    assert torch.linalg.norm(update - ref) / torch.linalg.norm(ref) < 1e-5


def check_bar_ends_at_100(ranks: list[dict]) -> None:
    """The run's last steps: ``state.max_steps`` is the steps taken on every rank, and
    rank 0's progress bar (the Trainer's own ProgressCallback) ends with n == total."""
    last = ranks[0]["steps"][-1]["step"]
    assert [r["max_steps"] for r in ranks] == [last, last]
    assert ranks[0]["bars"][-1] == {"n": last, "total": last, "step": last}
    # Before the end the total stays ahead of the steps taken (no early stop).
    assert all(s["max_steps"] > s["step"] for s in ranks[0]["steps"][:-1])


def check_epochs_and_resume(out: Path, strategy: str) -> None:
    """Two epochs over a mid-epoch checkpoint and resume: exactly once, the schedule to 0."""
    first = run(out, "epoch", strategy, "--stop", "2")
    saved = out / "run" / "checkpoint-2" / "odb_loader"
    assert sorted(p.name for p in saved.iterdir()) == ["rank0.pt", "rank1.pt"]
    resumed = run(out, "epoch", strategy, "--resume")
    per_rank = [a["steps"] + b["steps"] for a, b in zip(first, resumed, strict=True)]
    # Every rank runs the same optimizer steps, each with the same number of micro-steps.
    assert [[s["step"] for s in r] for r in per_rank][0] == [s["step"] for s in per_rank[1]]
    assert [s["micro"] for s in per_rank[0]] == [s["micro"] for s in per_rank[1]]
    assert [s["step"] for s in first[0]["steps"]] == [1, 2]
    # Two epochs of 40 samples: each epoch trains every sample exactly once across the
    # checkpoint, and the epoch's last window is cut short (grad_accum 3).
    for epoch in (0, 1):
        in_epoch = [s for r in per_rank for s in r if s["data_epoch"] == epoch]
        assert sorted(i for s in in_epoch for i in s["ids"]) == list(range(EPOCH_SAMPLES))
    assert any(s["micro"] < 3 for s in per_rank[0])
    # The schedule (linear to 0) ends with the data: the rate after the last step is 0,
    # every earlier one is not, and state.epoch is the loader's progress.
    rates = [s["lr_next"] for s in per_rank[0]]
    assert rates[-1] == 0.0 and all(r > 0 for r in rates[:-1])
    assert rates == sorted(rates, reverse=True)
    ends = [s["epoch"] for s in per_rank[0] if s is per_rank[0][-1] or s["data_epoch"] == 0]
    assert ends[-2:] == [pytest.approx(1.0), pytest.approx(2.0)]  # state.epoch = progress
    check_bar_ends_at_100(resumed)


if __name__ == "__main__":
    main()
