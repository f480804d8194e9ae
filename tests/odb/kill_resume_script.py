"""A 2-rank "training loop" that checkpoints its loader, for the kill-and-restart test.

``python kill_resume_script.py DIR kill``: every 5 steps each rank saves its own piece of
the loader state (no collective) to DIR/ckpt_<rank>.pt, as frameworks that checkpoint
per process do; rank 1 SIGKILLs itself after step 12.
``python kill_resume_script.py DIR resume``: loads every rank's piece and drains the epoch.
Each rank appends the ids it consumes to DIR/ids_<phase>_<rank>.txt.

The loader keeps the default ``align_timeout_s``: torchrun ends the surviving rank when
rank 1 dies, so no short bound is needed, and a short one fails the run whenever one
rank's first batch lags its peer's by that long (30 s did once in a suite run); a run
that truly hangs ends at the test's limit, which prints every process's stack.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

import odb
from harness.scenarios import LengthDataset

LENGTHS = [(i * 31) % 170 + 1 for i in range(150)]


def main(out: Path, phase: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = odb.ODBLoader(
        LengthDataset(LENGTHS),
        token_budget=256,
        buffer_budgets=2,
        queue_depth=2,
        num_workers=1,
    )
    loader.set_epoch(3)
    if phase == "resume":
        pieces = [torch.load(path, weights_only=False) for path in sorted(out.glob("ckpt_*.pt"))]
        loader.load_state_dict(pieces)
    log = open(out / f"ids_{phase}_{rank}.txt", "a")  # noqa: SIM115 - flushed per step
    for step, batch in enumerate(loader, start=1):
        log.write(" ".join(map(str, odb.pop_step_info(batch).sample_ids)) + "\n")
        log.flush()
        if step == 1:  # the collate process and its workers, for the orphan check
            pids = [p.pid for p in psutil.Process().children(recursive=True)]
            (out / f"children_{phase}_{rank}.txt").write_text(" ".join(map(str, pids)))
        if phase == "kill" and step % 5 == 0:
            torch.save(loader.state_dict(), out / f"ckpt_{rank}.tmp")
            os.replace(out / f"ckpt_{rank}.tmp", out / f"ckpt_{rank}.pt")
            dist.barrier()  # the model's checkpoint step, in a real loop
        if phase == "kill" and rank == 1 and step == 12:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
