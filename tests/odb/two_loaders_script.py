"""Run by the launcher tests: two ODB loaders (train + eval) alive at once on every rank.

Launched either by ``torchrun`` (as a script) or by ``harness.ranks.run_ranks`` (through
:func:`two_loaders`). Prints / returns what each loader yielded on this rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

import odb
from harness.scenarios import LengthDataset

TRAIN_LENGTHS = [(i * 37) % 200 + 1 for i in range(90)]
EVAL_LENGTHS = [(i * 53) % 120 + 1 for i in range(31)]


def _record(loader: odb.ODBLoader, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [list(odb.pop_step_info(batch).sample_ids) for batch in loader]


# init_timeout_s below the launchers' limits (run_ranks 180 s): a collate side that never
# joins its epoch's group fails with its processes described, not as a hung rank (seen
# once, process mode, clean clone of dd9463b: every rank waited out 180 s in next_batch)
INIT_TIMEOUT_S = 60.0


def two_loaders(rank: int, world_size: int, mode: str) -> dict[str, list]:
    """Interleave steps of a train and an eval loader; then run each alone for a second epoch."""
    train = odb.ODBLoader(
        LengthDataset(TRAIN_LENGTHS),
        token_budget=256,
        collate_mode=mode,
        buffer_budgets=2,
        queue_depth=2,
        align_timeout_s=60.0,
        init_timeout_s=INIT_TIMEOUT_S,
    )
    evals = odb.ODBLoader(
        LengthDataset(EVAL_LENGTHS),
        token_budget=128,
        collate_mode=mode,
        policy="paper",
        queue_depth=3,
        align_timeout_s=60.0,
        init_timeout_s=INIT_TIMEOUT_S,
    )
    out: dict[str, list] = {"train": [[]], "eval": [[]]}
    train_it, eval_it = iter(train), iter(evals)
    live = {"train": train_it, "eval": eval_it}
    while live:  # alternate one step of each while both are running
        for name in list(live):
            batch = next(live[name], None)
            if batch is None:
                del live[name]
            else:
                out[name][0].append(list(odb.pop_step_info(batch).sample_ids))
    out["train"].append(_record(train, 1))
    out["eval"].append(_record(evals, 1))
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo")
    result = two_loaders(dist.get_rank(), dist.get_world_size(), sys.argv[1])
    # One file per rank: two ranks' lines on one shared stdout pipe may interleave.
    Path(sys.argv[2], f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
