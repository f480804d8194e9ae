"""ODB under the HF Trainer: ``ODBTrainer`` with the exact loss, DDP or DeepSpeed ZeRO-2.

    torchrun --nproc_per_node 2 examples/hf_trainer.py                   # CPU, Gloo, ~30 s
    torchrun --nproc_per_node 2 examples/hf_trainer.py --deepspeed       # ZeRO-2 (CPU too)
    torchrun --nproc_per_node 2 examples/hf_trainer.py --resume           # from the last checkpoint
    torchrun --nproc_per_node 8 examples/hf_trainer.py --epochs 3         # one GPU node

``ODBTrainer`` feeds the Trainer from the ODB loader, passes each window's exact
normaliser as ``num_items_in_batch`` (``average_tokens_across_devices`` has no effect),
runs IDLE steps as zero-weight steps, drives the cosine schedule from the loader's
progress (the epoch's step count is not known in advance), and saves each rank's loader
state in every checkpoint so ``--resume`` continues exactly once.
"""

import argparse

import torch
from tiny import RandomTokens, tiny_model  # examples/tiny.py
from transformers import TrainingArguments

import odb
from odb.integrations.hf_trainer import ODBTrainer

ZERO2 = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",  # from TrainingArguments
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=-1, help="> 0: stop there instead")
    parser.add_argument("--deepspeed", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", default="results/examples/hf_trainer")
    args = parser.parse_args()

    targs = TrainingArguments(  # starts the process group under torchrun
        output_dir=args.out,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # a fraction: the schedule runs over progress, not a step count
        ignore_data_skip=True,  # the loader resumes from its own state, exactly once
        save_steps=4,
        logging_steps=1,
        report_to=[],
        use_cpu=not torch.cuda.is_available() and not args.deepspeed,
        deepspeed=ZERO2 if args.deepspeed else None,
    )
    loader = odb.ODBLoader(
        RandomTokens(args.samples),
        token_budget=512,
        num_workers=1,
        grad_accum_steps=targs.gradient_accumulation_steps,
    )
    trainer = ODBTrainer(model=tiny_model(), args=targs, train_loader=loader)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    if torch.distributed.is_initialized():  # leave the group before interpreter teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
