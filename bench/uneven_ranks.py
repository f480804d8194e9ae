"""Uneven ranks: odb vs a plain DataLoader at W = 2 when sample latency varies.

Each sample's ``__getitem__`` sleeps a heavy-tailed, per-index time (lognormal with
median ``--median-ms``, 7, and ``--sigma``, 1.5; capped at 0.5 s: I/O-like, so the
workers' latency, not the CPU, sets the pace) and returns ``input_ids``/``labels`` of
50-2000 tokens. The ranks then read at different speeds from round to round, and an odb
rank waits for its peer in each round's status all-gather; while it waits it reads
samples ahead for later rounds (``stats()['read_ahead']``), so its DataLoader workers
keep working instead of stopping once their prefetch is full. The default epoch (6000
samples) is long enough for many full-buffer rounds; in short epochs the buffer holds
most of a view, there are few rounds, and the waits matter little.

Loaders, two ranks (spawned, Gloo on 127.0.0.1), ``--workers`` DataLoader workers each:
``plain`` = ``DataLoader(batch_size=1, DistributedSampler)``; ``process`` / ``thread`` =
``ODBLoader(token_budget=8192)`` with that ``collate_mode``. Reported per epoch:
samples of both ranks / the slower rank's wall clock (``iter()`` to the last batch), the
samples each rank read ahead and its seconds waiting for its peers
(``stats()['align_seconds']``, reads ahead excluded).

    python -m bench.uneven_ranks --out results/bench/uneven_ranks.json
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

import odb
from bench import _io
from harness.ranks import run_ranks

LOADERS = ("plain", "process", "thread")


class SleepDataset:
    """Item ``i``: a per-index sleep (lognormal, capped) then 50-2000 tokens."""

    def __init__(self, n: int, seed: int, median_ms: float = 7.0, sigma: float = 1.5) -> None:
        self.n = n
        self.seed = seed
        self.mu = math.log(median_ms / 1000)
        self.sigma = sigma

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + index)
        time.sleep(min(0.5, rng.lognormvariate(self.mu, self.sigma)))
        ids = torch.arange(rng.randint(50, 2000)) % 100 + 3
        return {"input_ids": ids, "labels": ids.clone()}


def _first(batch: list[Any]) -> Any:
    return batch[0]


def _rank(rank: int, world: int, loader_name: str, args: Any) -> list[dict[str, float]]:
    """One rank's epochs: samples, wall seconds and samples read ahead, per epoch."""
    dataset = SleepDataset(args.n, args.seed, args.median_ms, args.sigma)
    if loader_name == "plain":
        sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
        loader: Any = DataLoader(dataset, batch_size=1, sampler=sampler,
                                 num_workers=args.workers, collate_fn=_first)
    else:
        loader = odb.ODBLoader(dataset, token_budget=8192, num_workers=args.workers,
                               collate_mode=loader_name, seed=args.seed)
    epochs = []
    for epoch in range(args.epochs):
        (sampler if loader_name == "plain" else loader).set_epoch(epoch)
        started, samples = time.perf_counter(), 0
        for batch in loader:
            samples += 1 if loader_name == "plain" else len(odb.pop_step_info(batch).sample_ids)
        wall = time.perf_counter() - started
        stats = {} if loader_name == "plain" else loader.stats()
        epochs.append({"samples": samples, "wall_s": wall,
                       "read_ahead": stats.get("read_ahead", 0),
                       "align_s": round(stats.get("align_seconds", 0.0), 2)})
    return epochs


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=6000, help="samples per epoch (both ranks)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--loaders", nargs="+", default=list(LOADERS), choices=LOADERS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--median-ms", type=float, default=7.0, help="median sample latency")
    p.add_argument("--sigma", type=float, default=1.5, help="lognormal sigma of the latency")
    args = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.loaders}
    for repeat in range(args.repeats):
        for name in args.loaders:  # interleaved, so drift hits every loader alike
            _io.progress(f"repeat {repeat + 1}/{args.repeats}: {name}")
            per_rank = run_ranks(_rank, 2, name, args, timeout=900)
            epochs = []
            for epoch in range(args.epochs):
                cells = [r[epoch] for r in per_rank]
                samples = sum(c["samples"] for c in cells)
                assert samples == args.n, (name, epoch, samples)
                wall = max(c["wall_s"] for c in cells)
                epochs.append({"samples_per_s": round(samples / wall, 1),
                               "read_ahead_per_rank": [c["read_ahead"] for c in cells],
                               "align_s_per_rank": [c["align_s"] for c in cells]})
            runs[name].append({"epochs": epochs})
            _io.progress(f"  {name}: {[e['samples_per_s'] for e in epochs]} samples/s, read "
                         f"ahead {[e['read_ahead_per_rank'] for e in epochs]}, waits "
                         f"{[e['align_s_per_rank'] for e in epochs]} s")
    _io.emit(
        {
            "benchmark": "uneven_ranks",
            "machine": _io.machine(),
            "settings": {
                "world_size": 2,
                "n": args.n,
                "num_workers": args.workers,
                "epochs": args.epochs,
                "repeats": args.repeats,
                "token_budget": 8192,
                "sample_latency": f"lognormal, median {args.median_ms} ms, sigma "
                f"{args.sigma}, capped at 0.5 s, per index (I/O-like sleep)",
            },
            "runs": runs,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
