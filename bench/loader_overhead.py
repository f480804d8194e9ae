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

Each run builds the loader once and iterates it for ``--epochs`` epochs (``set_epoch``
between them, as a training loop does). Reported per loader (median over ``--repeats``
runs, in the same process in turn): *startup* = seconds from ``iter()`` to the first
batch of the first epoch (process spawn, worker start, the first fill of the grouping buffer),
*later_startup_s* the same for the later epochs (median), *steady-state* samples/s from
each epoch's first batch to its last, and the end-to-end samples/s over all epochs,
start-ups included. Targets: ODB's steady-state samples/s >= 0.95x plain; end to end
over the epochs >= 1.0x plain (issue 15).

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
TARGET_OVERALL = 1.0


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
    """One epoch: start-up (``iter()`` to the first batch), samples, steps, seconds."""
    started = time.perf_counter()
    first = None
    samples = first_samples = steps = 0
    for batch in iterable:
        n = count(batch)
        if first is None:
            first, first_samples = time.perf_counter(), n
        samples += n
        steps += 1
    end = time.perf_counter()
    assert first is not None
    return {
        "startup_s": first - started,
        "total_s": end - started,
        "samples": samples,
        "steps": steps,
        "steady_samples": samples - first_samples,
        "steady_s": end - first,
    }


def _epochs(loader, count, epochs: int, set_epoch) -> dict[str, float]:
    """``epochs`` epochs of one loader, summed; start-ups of the later epochs apart."""
    per = []
    for epoch in range(epochs):
        set_epoch(epoch)
        per.append(_consume(loader, count))
    total = sum(p["total_s"] for p in per)
    samples = sum(p["samples"] for p in per)
    later = [p["startup_s"] for p in per[1:]]
    return {
        "startup_s": per[0]["startup_s"],
        "later_startup_s": statistics.median(later) if later else 0.0,
        "total_s": total,
        "samples": samples,
        "steps": sum(p["steps"] for p in per),
        "steady_samples_per_s": sum(p["steady_samples"] for p in per)
        / sum(p["steady_s"] for p in per),
        "overall_samples_per_s": samples / total,
    }


def _odb_count(batch) -> int:
    return odb.pop_step_info(batch).local_samples


def run_plain(ds: WorkDataset, workers: int, seed: int, epochs: int) -> dict[str, float]:
    g = torch.Generator()
    g.manual_seed(seed)
    loader = DataLoader(ds, batch_size=1, num_workers=workers, shuffle=True, generator=g)
    return _epochs(loader, lambda b: b["input_ids"].shape[0], epochs, lambda e: None)


def run_odb(
    ds: WorkDataset, workers: int, seed: int, mode: str, budget: int, epochs: int
) -> dict[str, float]:
    loader = odb.ODBLoader(
        ds, token_budget=budget, num_workers=workers, collate_mode=mode, seed=seed
    )
    out = _epochs(loader, _odb_count, epochs, loader.set_epoch)
    stats = loader.stats()
    out["padding_efficiency"] = stats.get("padding_efficiency")
    out["data_wait_s"] = stats.get("data_wait_s")
    return out


def _medians(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Median of every figure per loader, and ODB's ratios to plain with the targets."""
    med = {
        name: {
            k: round(statistics.median(r[k] for r in rs), 4)
            for k in rs[0]
            if isinstance(rs[0][k], (int, float))
        }
        for name, rs in runs.items()
    }
    plain = med["plain"]
    for name in ("odb_process", "odb_thread"):
        m = med[name]
        m["steady_vs_plain"] = round(m["steady_samples_per_s"] / plain["steady_samples_per_s"], 3)
        m["overall_vs_plain"] = round(
            m["overall_samples_per_s"] / plain["overall_samples_per_s"], 3
        )
        m["pass_steady>=0.95"] = m["steady_vs_plain"] >= TARGET
        m["pass_overall>=1.0"] = m["overall_vs_plain"] >= TARGET_OVERALL
    return med


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", nargs="+", default=["busy", "sleep"], choices=["busy", "sleep"])
    p.add_argument("--work-ms", type=float, default=1.0)
    p.add_argument("--budget", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="epochs per run, one loader")
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
                    r = run_plain(ds, args.workers, args.seed, args.epochs)
                else:
                    mode = name.split("_")[1]
                    r = run_odb(ds, args.workers, args.seed, mode, args.budget, args.epochs)
                assert r["samples"] == args.n * args.epochs, (name, r["samples"])
                runs[name].append(r)
        results[work] = {"median": _medians(runs), "runs": runs}
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
                "epochs": args.epochs,
                "lengths": "ultrachat-like",
                "consumer": "no-op (count samples)",
                "ideal_samples_per_s": round(args.workers * 1000 / args.work_ms),
            },
            "target_steady_vs_plain": TARGET,
            "target_overall_vs_plain": TARGET_OVERALL,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
