"""ODB in a DeepSpeed engine loop (ZeRO-2), with the exact loss.

    torchrun --nproc_per_node 2 examples/deepspeed_loop.py        # CPU, Gloo, ~30 s
    deepspeed --num_gpus 8 examples/deepspeed_loop.py --epochs 3   # one GPU node

``odb.integrations.deepspeed.windows`` yields one gradient-accumulation window per
optimizer step and sets DeepSpeed's window boundary itself (an epoch's last window may
be shorter than ``gradient_accumulation_steps``); ``window.backward`` runs
``engine.backward(loss, scale_wrt_gas=False)`` (the loss ``sum(token losses) /
info.loss_normalizer`` already covers the window) and ``engine.step()``. IDLE steps are
zero-loss micro-steps, so every rank's ZeRO reduce-scatter fires in step.

A mid-epoch checkpoint: ``--checkpoint DIR --stop-after K`` saves the engine
(``engine.save_checkpoint``: model, ZeRO optimizer shards, scheduler) and every rank's
own ``loader.state_dict()`` piece after K windows and stops; ``--checkpoint DIR
--resume`` loads them (the loader gets all pieces) and finishes the training, every
sample once.

On CPU the example marks DeepSpeed's shared-memory all-reduce op as not to be built
(``odb.integrations.deepspeed.skip_cpu_shm_comm_build``): DeepSpeed would JIT-compile
it at start-up, about a minute on 2 cores, for an op ZeRO training never calls.
"""

import argparse
import json
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from tiny import RandomTokens, tiny_model  # examples/tiny.py

import odb
from odb.integrations import ProgressLR
from odb.integrations.deepspeed import skip_cpu_shm_comm_build, windows


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
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    loader = odb.ODBLoader(
        RandomTokens(args.samples), token_budget=512, num_workers=1, grad_accum_steps=2
    )
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    epoch = start = 0
    scheduler = ProgressLR(
        optimizer,
        lambda done: 1.0 - done,  # linear decay over the data
        progress=lambda: (epoch + loader.progress()) / args.epochs,
    )
    engine = build_engine(model, optimizer, scheduler, loader.config.grad_accum_steps)
    if args.resume:
        start = resume(args.checkpoint, engine, loader)

    record, stop = [], False
    for epoch in range(start, args.epochs):
        loader.set_epoch(epoch)
        for window in windows(engine, loader):
            record.append(train_window(window, engine, optimizer))
            if args.record is not None and len(record) == 1 and dist.get_rank() == 0:
                args.record.mkdir(parents=True, exist_ok=True)  # for the tests' gradient check
                torch.save(engine.module.state_dict(), args.record / "step1.pt")
            if len(record) == args.stop_after:  # a window boundary: the loader's state
                save(args.checkpoint, engine, loader)  # covers exactly what was trained
                stop = True
                break
        if stop:
            break
        if dist.get_rank() == 0:
            print(
                f"epoch {epoch}: {len(record)} windows so far, lr now "
                f"{optimizer.param_groups[0]['lr']:.3g}",
                flush=True,
            )

    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        path = args.record / f"rank{dist.get_rank()}.json"
        path.write_text(json.dumps({"windows": record, "lr_end": optimizer.param_groups[0]["lr"]}))
    dist.destroy_process_group()


def build_engine(model, optimizer, scheduler, grad_accum_steps: int):
    """A ZeRO-2 DeepSpeed engine over ``model``, accumulating ``grad_accum_steps``
    micro-steps (the loader's) per optimizer step."""
    skip_cpu_shm_comm_build()  # before the engine starts DeepSpeed's comm backend
    config = {
        "train_micro_batch_size_per_gpu": 1,  # DeepSpeed's bookkeeping; ODB sizes batches
        "gradient_accumulation_steps": grad_accum_steps,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )
    return engine


def train_window(window, engine, optimizer) -> dict:
    """One accumulation window through the engine (its last backward steps the optimizer
    and the scheduler); returns what it trained on and the rate it trained at."""
    lr = optimizer.param_groups[0]["lr"]
    for batch, info in window:
        loss = engine(**batch, num_items_in_batch=info.loss_normalizer).loss
        window.backward(loss)  # the window's last one steps optimizer and scheduler
    return {
        "ids": [i for info in window.infos for i in info.sample_ids],
        "micro": len(window),
        "idle": window.idle_steps,
        "lr": lr,
    }


def resume(folder: Path, engine, loader) -> int:
    """Load what `save` wrote (the loader gets every rank's piece); the epoch to continue."""
    engine.load_checkpoint(str(folder), tag="stop")  # the rate saved with it
    pieces = [torch.load(path) for path in sorted(folder.glob("loader_rank*.pt"))]
    loader.load_state_dict(pieces)  # every rank's piece, on every rank
    return loader.epoch  # the saved epoch, continued where it stopped


def save(folder: Path, engine, loader) -> None:
    """The engine's checkpoint (all ranks write) and this rank's own loader piece."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(loader.state_dict(), folder / f"loader_rank{dist.get_rank()}.pt")
    engine.save_checkpoint(str(folder), tag="stop")  # collective; ends with a barrier
    dist.barrier()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
