"""What a worker's hand-off of big tensors costs: fresh shared memory vs recycled slabs.

One producer process (a DataLoader worker's part) makes ``--items`` tensors of
``--mb`` MB each in private memory (as preprocessing does) and pickles each as an ODB
worker does (``odb.sources._InlinePickler``): *fresh*, torch's way (a new
shared-memory segment, a copy, a descriptor), or *slabs*, into the recycled slabs of
:mod:`odb.slabs` dealt by the consumer. The consumer (the collate process's part)
unpickles each and keeps the last ``--window`` of them, like a grouping window, then
lets the oldest go. Reported per (mode, window): the producer's wall clock, user and
system CPU seconds and minor page faults, and the consumer's wall clock.

Run ``fresh`` with a window of 2 (what a plain DataLoader's consumer holds) and both
modes with a large window (an ODB window): on a VM that returns freed memory to its
host, fresh pages freed seconds after their write are the expensive ones.

    python -m bench.shm_recycling --out results/bench/shm_recycling.json
"""

from __future__ import annotations

import multiprocessing
import pickle
import resource
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

import odb.slabs as slabs
from bench import _io
from odb.handoff import BlockPool
from odb.slabs import WorkerSlabs
from odb.sources import _InlinePickler

MB = 1_000_000


def _produce(
    out: Any, done: Connection, items: int, nbytes: int, worker: WorkerSlabs | None
) -> None:
    torch.set_num_threads(1)
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for i in range(items):
        tensor = torch.empty(nbytes // 4, dtype=torch.float32).fill_(float(i))
        out.put(
            bytes(_InlinePickler.dumps({"i": i, "pixels": tensor}, pickle.HIGHEST_PROTOCOL, worker))
        )
    after = resource.getrusage(resource.RUSAGE_SELF)
    out.put(
        {
            "producer_wall_s": round(time.perf_counter() - start, 2),
            "producer_user_s": round(after.ru_utime - before.ru_utime, 2),
            "producer_sys_s": round(after.ru_stime - before.ru_stime, 2),
            "producer_minor_faults": after.ru_minflt - before.ru_minflt,
        }
    )
    done.recv()  # stay until the consumer has taken every descriptor


def run(mode: str, window: int, items: int, nbytes: int) -> dict[str, Any]:
    """One (mode, window) cell in fresh processes; its figures."""
    context = multiprocessing.get_context("fork")
    returns, _ = context.Pipe(duplex=False)
    slabs.open_arena(BlockPool(returns) if mode == "slabs" else None)
    arena = slabs.current_arena()
    worker = arena.deal(1, keep_bytes=1 << 40).for_worker(0) if arena is not None else None
    out = context.Queue(4)
    done_r, done_w = context.Pipe(duplex=False)
    producer = context.Process(target=_produce, args=(out, done_r, items, nbytes, worker))
    start = time.perf_counter()
    producer.start()
    held: list[Any] = []
    for _ in range(items):
        item = pickle.loads(out.get())
        assert float(item["pixels"][-1]) == float(item["i"])
        held = (held + [item])[-window:]
        if arena is not None:
            arena.pool.collect()  # the collate process does so on every read
    result = out.get()
    done_w.send(b"bye")
    producer.join()
    del held
    slabs.open_arena(None)
    return {
        "mode": mode,
        "window": window,
        "items": items,
        "mb_per_item": nbytes / MB,
        **result,
        "consumer_wall_s": round(time.perf_counter() - start, 2),
        "reused_fraction": round(arena.reused_bytes / (items * nbytes), 3) if arena else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=300)
    p.add_argument("--mb", type=float, default=40.0, help="MB per tensor")
    p.add_argument("--window", type=int, default=75, help="items the consumer keeps (large)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    nbytes = int(args.mb * MB) // 4 * 4
    cells = [("fresh", 2), ("fresh", args.window), ("slabs", args.window)]
    rows = []
    for repeat in range(args.repeats):
        for mode, window in cells:
            row = run(mode, window, args.items, nbytes)
            _io.progress(f"repeat {repeat} {mode} window={window}: {row}")
            rows.append(row)
    _io.emit({"benchmark": "shm_recycling", "machine": _io.machine(), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
