"""ODB in a torch FSDP2 (``fully_shard``) loop, with sharded checkpoints that resume at any size.

    torchrun --nproc_per_node 2 examples/fsdp_loop.py               # CPU, Gloo, ~20 s
    torchrun --nproc_per_node 8 examples/fsdp_loop.py --epochs 3    # one GPU node, NCCL

The tiny Qwen3 causal LM (``examples/tiny.py``) is sharded block by block, then as a
whole, with ``torch.distributed.fsdp.fully_shard``. ``odb.integrations.fsdp.windows``
yields one gradient-accumulation window per optimizer step: batches on the device,
gradient reduction held off (``set_requires_gradient_sync(False)``) until the window's
last micro-step, whatever its length. The loss is ``sum(token losses) /
info.loss_normalizer`` and FSDP's default divide-by-world-size makes it the gradient of
the global per-token mean (``window.backward`` corrects for a divide factor you set).
``ProgressLR`` decays the rate with the fraction of the data trained on.

A mid-epoch checkpoint: ``--checkpoint DIR --stop-after K`` saves, after K windows, the
sharded model and optimizer (``torch.distributed.checkpoint``) and every rank's own
``loader.state_dict()`` piece beside it, and stops; ``--checkpoint DIR --resume`` loads
them, at this run's world size (DCP reshards the model, the loader takes every piece),
and finishes the training, every sample once per epoch.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from tiny import RandomTokens, tiny_model  # examples/tiny.py
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

import odb
from odb.integrations import ProgressLR
from odb.integrations.fsdp import load_checkpoint, save_checkpoint, windows


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


def setup() -> tuple[torch.nn.Module, torch.device]:
    """Join the process group, build the model on this rank's device and shard it."""
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    model = tiny_model().to(device)
    for block in model.model.layers:  # one all-gather / reduce-scatter group per block
        fully_shard(block)
    fully_shard(model)  # the rest (embeddings, final norm, head)
    return model, device


def main() -> None:
    args = parse_args()
    model, device = setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # Built after init_process_group: construction is collective.
    loader = odb.ODBLoader(
        RandomTokens(args.samples), token_budget=512, num_workers=1, grad_accum_steps=2
    )
    epoch = start = 0
    scheduler = ProgressLR(
        optimizer,
        lambda done: 1.0 - done,  # linear decay to 0 over the data
        progress=lambda: (epoch + loader.progress()) / args.epochs,
    )
    if args.resume:  # after the scheduler: the saved optimizer state holds the next rate
        start = load_checkpoint(args.checkpoint, model, optimizer, loader)

    record = {"windows": [], "resumed_norm": param_norm(model) if args.resume else None}
    for epoch in range(start, args.epochs):
        loader.set_epoch(epoch)  # the saved epoch continues where it stopped
        for window in windows(model, loader, device):
            record["windows"].append({"epoch": epoch, **train_window(window, model, optimizer)})
            scheduler.step()  # the rate for the next window, from the progress reached
            if args.record is not None and len(record["windows"]) == 1:
                save_first_step(model, args.record)  # for the tests' gradient check
            if len(record["windows"]) == args.stop_after:  # a window boundary: the loader's
                save_checkpoint(args.checkpoint, model, optimizer, loader)  # state covers
                record["saved_norm"] = param_norm(model)  # exactly what was trained
                break
        else:
            if dist.get_rank() == 0:
                print(f"epoch {epoch}: {len(record['windows'])} windows so far", flush=True)
            continue
        break

    if args.record is not None:
        record["lr_end"] = optimizer.param_groups[0]["lr"]
        args.record.mkdir(parents=True, exist_ok=True)
        (args.record / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def train_window(window, model, optimizer) -> dict:
    """One optimizer step over one accumulation window; returns what it trained on, the
    rate it trained at and the window's global per-token-mean loss."""
    lr, loss_sum = optimizer.param_groups[0]["lr"], torch.zeros((), dtype=torch.float64)
    for batch, info in window:  # every micro-step but the last without gradient reduction
        loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss
        window.backward(loss)
        loss_sum += loss.detach().double().cpu()
    optimizer.step()
    optimizer.zero_grad()
    dist.all_reduce(loss_sum)  # each rank's losses are over W: the sum over ranks / W
    return {
        "ids": [i for info in window.infos for i in info.sample_ids],
        "micro": len(window),
        "idle": window.idle_steps,
        "lr": lr,
        "loss": loss_sum.item() / dist.get_world_size(),
    }


@torch.no_grad()
def param_norm(model) -> float:
    """The full (unsharded) parameters' norm, the same on every rank (collective)."""
    squares = sum(p.full_tensor().double().square().sum() for p in model.parameters())
    return float(squares.sqrt())


def save_first_step(model, folder: Path) -> None:
    """The full model after the first window, on rank 0 (collective)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(state, folder / "step1.pt")


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
