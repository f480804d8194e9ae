"""ODB in an Accelerate loop: ``prepare`` leaves the loader alone, ``windows`` trains it.

    torchrun --nproc_per_node 2 examples/accelerate_loop.py        # CPU, Gloo, ~20 s
    accelerate launch --num_processes 8 examples/accelerate_loop.py  # one GPU node

``odb.integrations.accelerate.prepare`` prepares the model and optimizer and hands the
ODB loader back untouched (Accelerate would shard and re-batch a DataLoader; ODB's
batches are already per rank and aligned). ``windows`` yields one gradient-accumulation
window per optimizer step: batches on ``accelerator.device``, ``no_sync`` on all but the
last micro-step. The Accelerator keeps ``gradient_accumulation_steps=1``: the loss
``sum(token losses) / info.loss_normalizer`` already covers the window. ``ProgressLR``
decays the rate with the fraction of the data trained on.

A mid-epoch checkpoint: ``--checkpoint DIR --stop-after K`` saves the model, the
optimizer and every rank's own ``loader.state_dict()`` piece after K windows and stops;
``--checkpoint DIR --resume`` loads them (the loader gets all pieces) and finishes the
training, every sample once.
"""

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from tiny import RandomTokens, tiny_model  # examples/tiny.py

import odb
from odb.integrations import ProgressLR
from odb.integrations.accelerate import prepare, windows


def parse_args() -> argparse.Namespace:
    """The command line: the training's size and rate, --record, and the checkpoint flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--record", type=Path, help="write what each rank trained on here")
    parser.add_argument("--checkpoint", type=Path, help="--stop-after saves here, --resume loads")
    parser.add_argument("--stop-after", type=int, help="save a checkpoint after K windows, stop")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # starts the process group
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = odb.ODBLoader(
        RandomTokens(args.samples), token_budget=512, num_workers=1, grad_accum_steps=2
    )
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)
    epoch = start = 0
    scheduler = ProgressLR(
        optimizer,
        lambda done: 1.0 - done,  # linear decay to 0 over the data
        progress=lambda: (epoch + loader.progress()) / args.epochs,
    )
    if args.resume:  # after the scheduler: the saved optimizer state holds the next rate
        start = resume(args.checkpoint, accelerator, model, optimizer, loader)

    record, stop = [], False
    for epoch in range(start, args.epochs):
        loader.set_epoch(epoch)
        for window in windows(accelerator, model, loader):
            record.append(train_window(window, model, optimizer, scheduler))
            if args.record is not None and len(record) == 1 and accelerator.is_main_process:
                args.record.mkdir(parents=True, exist_ok=True)  # for the tests' gradient check
                torch.save(accelerator.unwrap_model(model).state_dict(), args.record / "step1.pt")
            if len(record) == args.stop_after:  # a window boundary: the loader's state
                save(args.checkpoint, accelerator, model, optimizer, loader)  # covers exactly
                stop = True  # what was trained
                break
        if stop:
            break
        accelerator.print(
            f"epoch {epoch}: {len(record)} windows so far, lr now "
            f"{optimizer.param_groups[0]['lr']:.3g}"
        )

    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        path = args.record / f"rank{accelerator.process_index}.json"
        path.write_text(json.dumps({"windows": record, "lr_end": optimizer.param_groups[0]["lr"]}))
    accelerator.end_training()


def train_window(window, model, optimizer, scheduler) -> dict:
    """One optimizer step over one accumulation window; returns what it trained on and
    the rate it trained at."""
    lr = optimizer.param_groups[0]["lr"]
    for batch, info in window:  # every micro-step but the last under no_sync
        loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss
        window.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()  # the rate for the next window, from the progress reached
    return {
        "ids": [i for info in window.infos for i in info.sample_ids],
        "micro": len(window),
        "idle": window.idle_steps,
        "lr": lr,
    }


def resume(folder: Path, accelerator: Accelerator, model, optimizer, loader) -> int:
    """Load what `save` wrote (the loader gets every rank's piece); the epoch to continue."""
    state = torch.load(folder / "train.pt")
    accelerator.unwrap_model(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    pieces = [torch.load(path) for path in sorted(folder.glob("loader_rank*.pt"))]
    loader.load_state_dict(pieces)  # every rank's piece, on every rank
    return loader.epoch  # the saved epoch, continued where it stopped


def save(folder: Path, accelerator: Accelerator, model, optimizer, loader) -> None:
    """Model and optimizer (rank 0) and this rank's own loader piece (every rank)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(loader.state_dict(), folder / f"loader_rank{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        model_state = accelerator.unwrap_model(model).state_dict()
        torch.save({"model": model_state, "optimizer": optimizer.state_dict()}, folder / "train.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
