"""ODB under TRL: ``ODBSFTTrainer``, TRL's ``SFTTrainer`` trained from ODB batches.

    torchrun --nproc_per_node 2 examples/trl_sft.py                 # CPU, Gloo, ~30 s
    torchrun --nproc_per_node 2 examples/trl_sft.py --resume        # from the last checkpoint
    torchrun --nproc_per_node 8 examples/trl_sft.py --epochs 3      # one GPU node

The dataset is tokenised prompt-completion data as TRL takes it (``input_ids`` and a
``completion_mask``); TRL prepares it as usual (labels from the mask with
``completion_only_loss=True``, truncation to ``max_length``) and its collator and loss
run unchanged. ``ODBSFTTrainer`` builds an ODB loader over the prepared dataset (the
settings in ``odb_config``), passes each window's exact normaliser to TRL's loss, runs
IDLE steps as zero-weight steps, drives the cosine schedule and the progress bar from
the loader's progress, and saves each rank's loader state in every checkpoint so
``--resume`` continues exactly once. TRL's ``packing`` is refused: ODB batches whole
samples under a token budget instead (``docs/integrations.md``).
"""

import argparse

import datasets
import torch
from tiny import RandomTokens, tiny_model, tiny_tokenizer  # examples/tiny.py
from trl import SFTConfig

import odb
from odb.integrations.trl import ODBSFTTrainer


def prompt_completion(samples: int) -> datasets.Dataset:
    """Tokenised prompt-completion rows: ``input_ids`` and ``completion_mask`` (0 on the
    prompt, the quarter whose labels RandomTokens masks)."""
    rows = [RandomTokens(samples)[i] for i in range(samples)]
    return datasets.Dataset.from_dict(
        {
            "input_ids": [r["input_ids"].tolist() for r in rows],
            "completion_mask": [(r["labels"] != -100).int().tolist() for r in rows],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", default="results/examples/trl_sft")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    config = SFTConfig(  # starts the process group under torchrun
        output_dir=args.out,
        num_train_epochs=args.epochs,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # a fraction: the schedule runs over progress, not a step count
        ignore_data_skip=True,  # the loader resumes from its own state, exactly once
        completion_only_loss=True,  # labels from completion_mask
        max_length=256,
        save_steps=4,
        logging_steps=1,
        report_to=[],
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=False,  # a tiny model
    )
    trainer = ODBSFTTrainer(
        model=tiny_model(),
        args=config,
        train_dataset=prompt_completion(args.samples),
        processing_class=tiny_tokenizer(),
        odb_config=odb.ODBConfig(
            token_budget=512, num_workers=1, grad_accum_steps=config.gradient_accumulation_steps
        ),
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    if torch.distributed.is_initialized():  # leave the group before interpreter teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
