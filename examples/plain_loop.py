"""ODB in a plain PyTorch DDP loop: the loader, the step-info boundary, the exact loss.

    torchrun --nproc_per_node 2 examples/plain_loop.py              # CPU, Gloo, ~20 s
    torchrun --nproc_per_node 8 examples/plain_loop.py --epochs 3   # one GPU node, NCCL
    python examples/plain_loop.py                                   # one process

A tiny Qwen3 causal LM (``examples/tiny.py``: built from a config, random weights)
learns random token sequences of 16-200 tokens. Every rank yields the same number of
batches; each batch's step info is popped before ``model(**batch)`` and its
``loss_normalizer`` passed as ``num_items_in_batch``, so DDP's gradient average is the
gradient of the global per-token mean. IDLE batches (a rank with nothing left this step)
are ordinary steps with every label masked. The learning rate follows ``loader.progress()``.
"""

import argparse
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
from tiny import RandomTokens, tiny_model  # examples/tiny.py

import odb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--record", type=Path, help="write what each rank trained on here")
    args = parser.parse_args()

    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device(
        f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu"
    )
    model = tiny_model().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # Built after init_process_group: construction is collective.
    loader = odb.ODBLoader(RandomTokens(args.samples), token_budget=512, num_workers=1)

    steps = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        done = epoch / args.epochs  # fraction of training before the next batch
        for batch in loader:
            info = odb.pop_step_info(batch)  # before model(**batch): the model never sees it
            for group in optimizer.param_groups:  # cosine over the data, not over a step count
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * done))
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = ddp(**batch, num_items_in_batch=info.loss_normalizer).loss
            loss.backward()  # DDP averages over ranks: the global per-token-mean gradient
            optimizer.step()
            optimizer.zero_grad()
            done = (epoch + loader.progress()) / args.epochs
            steps.append({"ids": list(info.sample_ids), "idle": info.idle})
            if rank == 0:
                print(
                    f"epoch {epoch} step {info.step} samples {info.global_samples} "
                    f"loss tokens {info.global_loss_tokens} idle {info.idle}",
                    flush=True,
                )
        if rank == 0:
            stats = loader.stats()
            print(
                f"epoch {epoch}: {stats['steps']} steps, padding efficiency "
                f"{stats['padding_efficiency']:.2f}, IDLE steps {stats['idle_steps']}",
                flush=True,
            )

    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        (args.record / f"rank{rank}.json").write_text(json.dumps({"steps": steps}))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":  # ODB's collate process needs the guard
    main()
