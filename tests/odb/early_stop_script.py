"""Run by tests/odb/test_early_stop.py: a complete run that stops early, then ends normally.

A map-style dataset whose ``__getitem__`` does real torch work (like a decode or a
transform), a thread-mode loader, a loop that ``break``s after two batches, and a
script that then simply ends. Usage (alone, or under torchrun for more ranks)::

    python tests/odb/early_stop_script.py {held,dropped}

``held``: the iterator is still referenced when the interpreter exits; ``dropped``: it
is released right after the break. Prints ``stopped early`` on success; the exit code
is the test's verdict.
"""

from __future__ import annotations

import os
import sys
import threading

import torch
import torch.distributed as dist

import odb
from harness.scenarios import make_sample


class HeavyDataset:
    """Each sample costs a chain of matrix products (tenths of a second of torch work)."""

    def __len__(self) -> int:
        return 64 * int(os.environ.get("WORLD_SIZE", "1"))  # 64 a rank: the epoch runs on

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(384, 384, generator=generator)
        for _ in range(200):
            x = torch.tanh(x @ x)  # every product releases and re-takes the GIL
        return make_sample(index, 8 + index % 5)


def main(variant: str) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    loader = odb.ODBLoader(
        HeavyDataset(), token_budget=24, collate_mode="thread", num_workers=0, queue_depth=1
    )
    it = iter(loader)
    for step, _ in enumerate(it):
        if step == 1:
            break
    if variant == "dropped":
        del it  # the runner's close joins the collate thread until it has ended
        alive = [t.name for t in threading.enumerate() if t.name.startswith("odb-collate")]
        assert not alive, f"collate threads alive after the iterator was closed: {alive}"
    print("stopped early", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
