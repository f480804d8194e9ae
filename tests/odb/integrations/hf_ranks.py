"""ODBTrainer on real ranks (run under torchrun by test_hf_trainer.py); one JSON per rank.

    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py grad ddp OUT
    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py epoch ddp OUT --stop K
    torchrun --nproc_per_node 2 tests/odb/integrations/hf_ranks.py epoch ddp OUT --resume

``grad``: 3 samples that never share a group, grad_accum 2, SGD lr 1, one optimizer step:
rank 0 trains two samples, rank 1 one sample and one IDLE step; rank 0 saves the
parameters after the step. ``epoch``: 40 samples, grad_accum 3 (so a window is cut
short at the epoch's end), linear schedule to 0 over two epochs, a checkpoint every 2
steps; ``--stop K`` ends the run after step K's checkpoint, ``--resume`` continues from
the newest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainingArguments

import odb
from odb.integrations.hf_trainer import ODBTrainer
from tests.odb.integrations.tiny import TokenDataset, tiny_model

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 2**31 - 1,
}


class Recorder(TrainerCallback):
    """Per optimizer step: this rank's windows (ids, idle) and the next step's rate."""

    def __init__(self, trainer: ODBTrainer, stop: int | None) -> None:
        self.trainer, self.stop, self.steps = trainer, stop, []

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
            }
        )
        if self.stop is not None and state.global_step >= self.stop:
            control.should_training_stop = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["grad", "epoch"])
    parser.add_argument("strategy", choices=["ddp", "deepspeed"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--stop", type=int)
    parser.add_argument("--resume", action="store_true")
    opt = parser.parse_args()
    grad = opt.mode == "grad"
    accum = 2 if grad else 3
    args = TrainingArguments(
        output_dir=str(opt.out / "run"),
        use_cpu=opt.strategy == "ddp",
        deepspeed=DS_CONFIG if opt.strategy == "deepspeed" else None,
        gradient_accumulation_steps=accum,
        ignore_data_skip=True,
        optim="sgd",
        learning_rate=1.0 if grad else 0.05,
        lr_scheduler_type="constant" if grad else "linear",
        max_steps=1 if grad else -1,
        num_train_epochs=1 if grad else 2,
        max_grad_norm=0.0,
        save_strategy="no" if grad else "steps",
        save_steps=2,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        seed=0,
        ddp_backend="gloo",
    )
    # 3 samples of 40-60 tokens under a 64-token budget: every group is one sample.
    dataset = TokenDataset(3, 40, 60) if grad else TokenDataset(40, 8, 48, seed=1)
    loader = odb.ODBLoader(
        dataset,
        token_budget=64 if grad else 96,
        grad_accum_steps=accum,
        collate_mode="thread",
        shuffle=not grad,
    )
    trainer = ODBTrainer(model=tiny_model(), args=args, train_loader=loader)
    recorder = Recorder(trainer, opt.stop)
    trainer.add_callback(recorder)
    trainer.train(resume_from_checkpoint=True if opt.resume else None)
    rank = int(os.environ["RANK"])  # (HF reports world size 1 under DeepSpeed on CPU)
    if grad and rank == 0:
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        torch.save(params, opt.out / "params.pt")
    tag = "resume" if opt.resume else "first"
    result = {
        "steps": recorder.steps,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "lr_final": trainer.optimizer.param_groups[0]["lr"],
    }
    (opt.out / f"{tag}_rank{rank}.json").write_text(json.dumps(result))
    # Leave the trainer's group before exit: once, at W=2 on a loaded machine, rank 0
    # aborted in interpreter teardown ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
