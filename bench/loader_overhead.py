"""Loader throughput: ``odb.ODBLoader`` vs a plain ``DataLoader`` with the same workers.

One map-style dataset whose ``__getitem__`` does about 1 ms of work and returns a dict
with ``input_ids`` and ``labels`` (lengths from the UltraChat-like distribution of
:mod:`bench.distributions`). ``--work busy`` spins on ``time.perf_counter`` for 1 ms
(CPU-bound preprocessing: it competes with the collate process for the 2 cores);
``--work sleep`` sleeps 1 ms (I/O-like: it measures pipeline overhead, not CPU
contention). The default runs both.

Loaders, each with ``num_workers=2`` and a no-op consumer (the loop only counts):

* ``plain``: ``DataLoader(dataset, batch_size=1, num_workers=2, shuffle=True)``;
* ``odb_process``: ``ODBLoader(dataset, token_budget=8192, num_workers=2)`` (collate
  process, the default);
* ``odb_thread``: the same with ``collate_mode="thread"``.

Reported per loader (median over ``--repeats`` runs, in the same process in turn):
*startup* = seconds from ``iter()`` to the first batch (process spawn, worker start,
the first grouping window) and *steady-state* samples/s from the first batch to the
last, besides the end-to-end samples/s. Target (issue): ODB's steady-state samples/s
>= 0.95x plain.

    python -m bench.loader_overhead --out results/bench/loader_overhead.json
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.data import DataLoader

import odb
from bench import _io
from bench.distributions import lengths

TARGET = 0.95


class WorkDataset:
    """Item ``i``: ``input_ids``/``labels`` of ``lengths[i]`` tokens after ~``work_ms`` of work."""

    def __init__(self, lens: list[int], work: str, work_ms: float) -> None:
        self.lens = lens
        self.work = work
        self.work_s = work_ms / 1000

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.work == "busy":
            end = time.perf_counter() + self.work_s
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.work_s)
        ids = torch.arange(self.lens[index], dtype=torch.long) % 1000 + 3
        labels = ids.clone()
        labels[: len(labels) // 4] = -100
        return {"input_ids": ids, "labels": labels}


def _consume(iterable, count) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    samples = 0
    steps = 0
    for batch in iterable:
        if first is None:
            first = time.perf_counter()
            first_samples = count(batch)
            samples += first_samples
        else:
            samples += count(batch)
        steps += 1
    end = time.perf_counter()
    assert first is not None
    return {
        "startup_s": first - started,
        "total_s": end - started,
        "samples": samples,
        "steps": steps,
        "steady_samples_per_s": (samples - first_samples) / (end - first),
        "overall_samples_per_s": samples / (end - started),
    }


def _odb_count(batch) -> int:
    return odb.pop_step_info(batch).local_samples


def run_plain(ds: WorkDataset, workers: int, seed: int) -> dict[str, float]:
    g = torch.Generator()
    g.manual_seed(seed)
    loader = DataLoader(ds, batch_size=1, num_workers=workers, shuffle=True, generator=g)
    return _consume(loader, lambda b: b["input_ids"].shape[0])


def run_odb(ds: WorkDataset, workers: int, seed: int, mode: str, budget: int) -> dict[str, float]:
    loader = odb.ODBLoader(
        ds, token_budget=budget, num_workers=workers, collate_mode=mode, seed=seed
    )
    out = _consume(loader, _odb_count)
    stats = loader.stats()
    out["padding_efficiency"] = stats.get("padding_efficiency")
    out["data_wait_s"] = stats.get("data_wait_s")
    return out


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", nargs="+", default=["busy", "sleep"], choices=["busy", "sleep"])
    p.add_argument("--work-ms", type=float, default=1.0)
    p.add_argument("--budget", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    lens = lengths("ultrachat", args.n, args.seed).tolist()
    results = {}
    for work in args.work:
        ds = WorkDataset(lens, work, args.work_ms)
        runs: dict[str, list[dict]] = {"plain": [], "odb_process": [], "odb_thread": []}
        for rep in range(args.repeats):
            for name in runs:  # interleaved, so drift hits every loader alike
                _io.progress(f"{work} repeat {rep + 1}/{args.repeats}: {name}")
                if name == "plain":
                    r = run_plain(ds, args.workers, args.seed)
                else:
                    r = run_odb(ds, args.workers, args.seed, name.split("_")[1], args.budget)
                assert r["samples"] == args.n, (name, r["samples"])
                runs[name].append(r)
        med = {
            name: {
                k: round(statistics.median(r[k] for r in rs), 4)
                for k in rs[0]
                if isinstance(rs[0][k], (int, float))
            }
            for name, rs in runs.items()
        }
        base = med["plain"]["steady_samples_per_s"]
        for name in ("odb_process", "odb_thread"):
            med[name]["steady_vs_plain"] = round(med[name]["steady_samples_per_s"] / base, 3)
            med[name]["overall_vs_plain"] = round(
                med[name]["overall_samples_per_s"] / med["plain"]["overall_samples_per_s"], 3
            )
            med[name]["pass_steady>=0.95"] = med[name]["steady_vs_plain"] >= TARGET
        results[work] = {"median": med, "runs": runs}
    _io.emit(
        {
            "benchmark": "loader_overhead",
            "machine": _io.machine(),
            "settings": {
                "n": args.n,
                "num_workers": args.workers,
                "work_ms": args.work_ms,
                "token_budget": args.budget,
                "repeats": args.repeats,
                "lengths": "ultrachat-like",
                "consumer": "no-op (count samples)",
                "ideal_samples_per_s": round(args.workers * 1000 / args.work_ms),
            },
            "target_steady_vs_plain": TARGET,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
