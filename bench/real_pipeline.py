"""odb vs a plain DataLoader on the real Qwen3-VL preprocessing path (the four proxies).

Every (proxy, W, loader) cell runs in fresh processes: W ranks spawned by
``harness.ranks.run_ranks`` (Gloo over TCP on 127.0.0.1, a free port), each building the
same ``experiments.data.pipeline.PreprocessedDataset`` (images decoded and turned into
``pixel_values``; per-proxy pixel budget as the proxies were calibrated for,
``experiments.data.proxies.default_max_pixels``: 768x768, ShareGPT4o 3072x3072) and
iterating it with one of

* ``plain``: ``DataLoader(dataset, batch_size=1, num_workers=--workers,
  sampler=DistributedSampler(dataset, W, rank, seed=--seed), collate_fn=collate)``;
* ``odb``: ``odb.ODBLoader(dataset, token_budget=--budget, num_workers=--workers,
  collate_fn=collate, seed=--seed)`` with every other setting at its default (a collate
  process);
* ``odb-thread``: the same with ``collate_mode="thread"`` (the collate side in a thread
  of the trainer);

where ``collate`` is the project's own (``experiments.data.pipeline.collate`` with the
tokenizer's pad id; its ``pixel_values`` is an ``odb.TensorParts`` for every loader, which
a trainer concatenates on its device when it moves the batch, so neither loader's
consumer here concatenates or reads the pixels). The consumer counts samples and
tokens, and with ``--consumer-us-per-token`` also holds the GIL in pure Python per real
token (a busy trainer's worst case for a collate thread).

Reported per cell (each rank measures its own; the cell sums or takes the slowest):

* ``samples_per_s``: samples emitted on all ranks / the slowest rank's wall-clock,
  measured from just before ``iter()`` (so the collate process's start, the workers'
  start and the first fill of the grouping buffer are inside) to the last batch;
* ``samples_per_s_per_epoch``: the same for each epoch alone (a later epoch runs on the
  collate process the first one started);
* ``first_batch_s``: from ``iter()`` to the first batch (slowest rank, per epoch);
* ``peak_anon_shm_mb``: the peak over time of the machine's anonymous and shared memory
  (``/proc/meminfo`` AnonPages + Shmem) above its level at the cell's start, **sampled**
  by a background thread of this process every ``--mem-interval-ms``: every page the
  cell's processes (ranks, DataLoader workers, collate processes) hold counts once,
  including copy-on-write pages of forked workers and shared memory that a worker wrote
  and no process has touched since (a sample's pixels waiting in the grouping buffer), which
  ``peak_uss_mb`` / ``peak_pss_mb`` (psutil's USS and PSS summed over the processes,
  only with ``--smaps-interval-ms``: reading them walks every page table and slows the
  loaders measured) miss. Machine-wide: run it with nothing else allocating meanwhile;
* ``collate_cpu_us_per_sample`` (odb only): CPU time of the collate side
  (``stats()['collate_cpu_s']``: the collate process, or the collate thread) per sample;
* ``padding_efficiency``: real tokens (``attention_mask`` ones) / padded tokens
  (``attention_mask`` elements) of the emitted non-IDLE batches, for both loaders;
* ``steps``: batches per rank (the slowest rank), IDLE steps apart;
* odb only: its ``stats()`` per rank and epoch.

``--repeat N`` runs every loader of a cell N times, alternating (plain, odb, plain,
odb, ...): the cell reports the median run of each loader and every repeat's paired
ratio, since one run of a cell moves by up to ~0.3x on a loaded 2-core VM.
``--pixels float32`` makes samples carry the image processor's own float32
``pixel_values`` instead of the default uint8 (``experiments.data.pixels``).

CPU-proxy scale: all processes share the machine's cores (see ``machine``), so compare
the loaders within one run, never across machines.

    python -m bench.real_pipeline --samples 240 --world 1 2 --out results/bench/real_pipeline.json

Needs the data assets of ``make reproduce`` (``results/data/proxies`` and
``results/data/assets/processor``), or ``--proxies-dir`` / ``--processor``.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench import _io
from experiments.data.proxies import PROXY_NAMES, default_max_pixels
from harness.ranks import run_ranks

LOADERS = ("plain", "odb", "odb-thread")
# What each odb variant sets on top of --odb.
_VARIANTS = {"odb": {}, "odb-thread": {"collate_mode": "thread"}}
MB = 1 << 20
# Nothing on this path may reach a hub; set in every rank before HF code is imported.
_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class CellSpec:
    """What one rank of one (proxy, W, loader) cell runs; picklable for the spawn."""

    proxy: str
    source: str
    processor: str
    loader: str
    samples: int
    budget: int
    workers: int
    epochs: int
    max_pixels: int
    cutoff_len: int
    seed: int
    progress_s: float
    odb_options: tuple[tuple[str, Any], ...] = ()
    consumer_us_per_token: float = 0.0
    pixels: str = "uint8"


def proxy_source(root: Path, name: str) -> str:
    """The ``DataConfig.source`` of a proxy written by ``experiments.data.proxies``."""
    return str(root / name / "llava_instruct_150k.json") if name == "llava" else str(root / name)


# ---------------------------------------------------------------- memory (this process)


def machine_memory_bytes() -> dict[str, int]:
    """``AnonPages`` and ``Shmem`` of ``/proc/meminfo``, in bytes: the machine's
    anonymous and shared pages, each physical page counted once, read in O(1) (the
    kernel keeps the counters), so sampling them costs the processes measured nothing."""
    wanted = {"AnonPages:": "anon", "Shmem:": "shmem"}
    found = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key = wanted.get(line.split(maxsplit=1)[0])
            if key:
                found[key] = int(line.split()[1]) * 1024
    return {"anon": found.get("anon", 0), "shmem": found.get("shmem", 0)}


def machine_shmem_bytes() -> int:
    """Shared memory in use on the machine (``Shmem`` of ``/proc/meminfo``)."""
    return machine_memory_bytes()["shmem"]


class TreeMemorySampler:
    """Peak memory of a cell, sampled in a thread at two rates.

    * anon + shm, every ``interval_s``: the machine's anonymous and shared pages
      (``/proc/meminfo``) above their level when the sampler started. Every page the
      cell's processes hold counts once: copy-on-write pages of forked workers, and
      shared memory that a worker wrote and no process has touched since (a sample's
      pixels waiting in the grouping buffer). It is the figure to compare, on a machine where
      nothing else allocates meanwhile.
    * USS and PSS summed over this process's descendants (psutil), every
      ``smaps_interval_s`` (0, the default: never; the figures are then None). Reading
      them walks every page table of every process (``/proc/PID/smaps``): every 50 ms
      that took a quarter of a 2-core machine, and every 2 s still 3%, a cost that
      grows with the memory mapped, so it slows the loader that maps more (a34438c,
      ``docs/benchmarks.md``, "The memory sampler"). They also miss shared memory no
      process has touched since mapping it.

    Sampling misses peaks shorter than the interval; the result says it was sampled.

    Example:
        >>> with TreeMemorySampler(0.05) as mem:  # doctest: +SKIP
        ...     run_ranks(...)
        >>> mem.result()["peak_anon_shm_mb"]  # doctest: +SKIP
    """

    def __init__(self, interval_s: float, smaps_interval_s: float = 0.0) -> None:
        if interval_s <= 0 or smaps_interval_s < 0:
            raise ValueError(
                f"interval_s must be > 0 and smaps_interval_s >= 0 (0: no USS/PSS), got "
                f"{interval_s} and {smaps_interval_s}"
            )
        self.interval_s = interval_s
        self.smaps_interval_s = smaps_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-memory", daemon=True)
        self.peak_uss = 0
        self.peak_pss = 0
        self.peak_anon_shm = 0
        self.peak_processes = 0
        self.samples = 0
        self.smaps_samples = 0

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        me = psutil.Process(os.getpid())
        base = sum(machine_memory_bytes().values())
        next_smaps = time.monotonic()
        while not self._stop.is_set():
            self.samples += 1
            used = sum(machine_memory_bytes().values()) - base
            self.peak_anon_shm = max(self.peak_anon_shm, used)
            if self.smaps_interval_s and time.monotonic() >= next_smaps:
                self._sample_smaps(me)
                next_smaps = time.monotonic() + self.smaps_interval_s
            self._stop.wait(self.interval_s)

    def _sample_smaps(self, me: psutil.Process) -> None:
        uss = pss = count = 0
        try:
            children = me.children(recursive=True)
        except psutil.Error:
            children = []
        for proc in children:
            try:
                info = proc.memory_full_info()
            except (psutil.Error, OSError):  # exited between the listing and the read
                continue
            uss += info.uss
            pss += info.pss
            count += 1
        if count:
            self.smaps_samples += 1
            if uss > self.peak_uss:
                self.peak_uss, self.peak_processes = uss, count
            self.peak_pss = max(self.peak_pss, pss)

    def result(self) -> dict[str, Any]:
        smaps = (
            f"USS / PSS summed over all processes of the cell (ranks, workers, collate "
            f"processes) every {self.smaps_interval_s * 1000:.0f} ms"
            if self.smaps_interval_s
            else "USS / PSS not sampled"
        )
        sampled = self.smaps_samples > 0
        return {
            "peak_uss_mb": round(self.peak_uss / MB, 1) if sampled else None,
            "peak_pss_mb": round(self.peak_pss / MB, 1) if sampled else None,
            "peak_anon_shm_mb": round(self.peak_anon_shm / MB, 1),
            "processes_at_peak_uss": self.peak_processes if sampled else None,
            "memory_samples": self.samples,
            "smaps_samples": self.smaps_samples,
            "memory_method": f"anon + shm every {self.interval_s * 1000:.0f} ms: the "
            "machine's AnonPages + Shmem (/proc/meminfo) above their level at the cell's "
            f"start; {smaps}",
        }


# ---------------------------------------------------------------- one rank


def _own_uss_mb() -> float:
    me = psutil.Process(os.getpid())
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().uss
        except psutil.Error:
            pass
    return round(total / MB, 1)


def _build_loader(spec: CellSpec, dataset: Any, rank: int, world: int) -> tuple[Any, Any]:
    """(loader, the object whose ``set_epoch`` selects the epoch's order)."""
    from torch.utils.data import DataLoader, DistributedSampler

    import odb
    from experiments.data.pipeline import collate

    collate_fn = partial(collate, pad_token_id=dataset.tokenizer.pad_token_id)
    if spec.loader in _VARIANTS:
        loader = odb.ODBLoader(
            dataset,
            token_budget=spec.budget,
            num_workers=spec.workers,
            collate_fn=collate_fn,
            seed=spec.seed,
            **(dict(spec.odb_options) | _VARIANTS[spec.loader]),
        )
        return loader, loader
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=sampler,
        num_workers=spec.workers,
        collate_fn=collate_fn,
    )
    return loader, sampler


def _run_epoch(spec: CellSpec, loader: Any, label: str) -> dict[str, Any]:
    import odb

    started = time.perf_counter()
    first_s = None
    samples = steps = idle = real = padded = 0
    next_report = started + spec.progress_s
    for batch in loader:
        now = time.perf_counter()
        if first_s is None:
            first_s = now - started
        if spec.loader in _VARIANTS:
            info = odb.pop_step_info(batch)
            n, is_idle = info.local_samples, info.idle
        else:
            n, is_idle = batch["input_ids"].shape[0], False
        steps += 1
        samples += n
        if is_idle:
            idle += 1
        else:
            mask = batch["attention_mask"]
            tokens = int(mask.sum())
            real += tokens
            padded += mask.numel()
            _busy(tokens * spec.consumer_us_per_token * 1e-6)
        del batch
        if now >= next_report:
            _rank_progress(label, samples, steps, now - started, first_s)
            next_report = now + spec.progress_s
    wall = time.perf_counter() - started
    _rank_progress(label + " done", samples, steps, wall, first_s)
    return {
        "samples": samples,
        "steps": steps,
        "idle_steps": idle,
        "wall_s": round(wall, 3),
        "first_batch_s": None if first_s is None else round(first_s, 3),
        "real_tokens": real,
        "padded_tokens": padded,
    }


def _busy(seconds: float) -> None:
    """Hold the GIL in pure Python for ``seconds``: a stand-in for a trainer's own work.

    Not a model of GPU training (a CUDA step mostly waits with the GIL released): the
    worst case for a collate thread that shares the trainer's interpreter.
    """
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _rank_progress(label: str, samples: int, steps: int, elapsed: float, first: float | None):
    first_txt = "no batch yet" if first is None else f"first batch {first:.2f} s"
    rate = samples / elapsed if elapsed > 0 else 0.0
    print(
        f"  [{label}] {samples} samples, {steps} steps in {elapsed:.1f} s: "
        f"{rate:.1f} samples/s ({first_txt})",
        file=sys.stderr,
        flush=True,
    )


def rank_cell(rank: int, world: int, spec: CellSpec) -> dict[str, Any]:
    """One rank of a cell: build the dataset and loader, run the epochs, measure."""
    import multiprocessing

    from experiments.data.pipeline import DataConfig, PreprocessedDataset

    # A rank started by multiprocessing's spawn inherits "spawn" as its default start
    # method, so a plain DataLoader's workers would re-import torch and unpickle the
    # dataset (25-35 s to the first batch on a loaded 2-core machine). A rank started
    # by torchrun has the platform default (fork on Linux); give the rank that.
    multiprocessing.set_start_method(None, force=True)

    dataset = PreprocessedDataset(
        DataConfig(
            spec.proxy,
            spec.source,
            spec.processor,
            cutoff_len=spec.cutoff_len,
            image_max_pixels=spec.max_pixels,
            seed=spec.seed,
            max_samples=spec.samples,
            pixels=spec.pixels,
        )
    )
    if len(dataset) != spec.samples:
        raise ValueError(
            f"{spec.proxy} at {spec.source} has {len(dataset)} records, fewer than "
            f"--samples {spec.samples}; lower --samples or generate more rows"
        )
    loader, epoch_setter = _build_loader(spec, dataset, rank, world)
    uss_before = _own_uss_mb()
    epochs = []
    for epoch in range(spec.epochs):
        epoch_setter.set_epoch(epoch)
        label = f"{spec.proxy} W={world} {spec.loader} rank {rank} epoch {epoch}"
        record = _run_epoch(spec, loader, label)
        if spec.loader in _VARIANTS:
            record["odb_stats"] = loader.stats()
        epochs.append(record)
    return {"rank": rank, "uss_before_iter_mb": uss_before, "epochs": epochs}


# ---------------------------------------------------------------- one cell


def run_cell(
    spec: CellSpec,
    world: int,
    mem_interval_s: float,
    timeout_s: float,
    smaps_interval_s: float = 0.0,
) -> dict:
    """Run one (proxy, W, loader) cell on ``world`` fresh ranks; summarise it."""
    with TreeMemorySampler(mem_interval_s, smaps_interval_s) as mem:
        ranks = run_ranks(rank_cell, world, spec, timeout=timeout_s, env=_OFFLINE_ENV)
    return summarise(ranks) | mem.result()


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell's numbers from its ranks' records (sums, or the slowest rank)."""
    per_rank_wall = [sum(e["wall_s"] for e in r["epochs"]) for r in ranks]
    samples = sum(e["samples"] for r in ranks for e in r["epochs"])
    real = sum(e["real_tokens"] for r in ranks for e in r["epochs"])
    padded = sum(e["padded_tokens"] for r in ranks for e in r["epochs"])
    epochs = len(ranks[0]["epochs"])
    wall = max(per_rank_wall)
    out: dict[str, Any] = {
        "samples": samples,
        "samples_per_s": round(samples / wall, 2) if wall > 0 else None,
        "wall_s": round(wall, 3),
        "samples_per_s_per_epoch": [_epoch_rate(ranks, e) for e in range(epochs)],
        "first_batch_s": max(r["epochs"][0]["first_batch_s"] or 0.0 for r in ranks),
        "first_batch_s_per_epoch": [
            max(r["epochs"][e]["first_batch_s"] or 0.0 for r in ranks) for e in range(epochs)
        ],
        "steps": max(sum(e["steps"] for e in r["epochs"]) for r in ranks),
        "idle_steps": sum(e["idle_steps"] for r in ranks for e in r["epochs"]),
        "padding_efficiency": round(real / padded, 4) if padded else None,
        "real_tokens": real,
        "padded_tokens": padded,
        "uss_before_iter_mb": round(sum(r["uss_before_iter_mb"] for r in ranks), 1),
        "collate_cpu_us_per_sample": _collate_cpu_us(ranks, samples),
        "per_rank": [
            {
                "rank": r["rank"],
                "samples": sum(e["samples"] for e in r["epochs"]),
                "wall_s": round(w, 3),
                "samples_per_s": round(sum(e["samples"] for e in r["epochs"]) / w, 2)
                if w > 0
                else None,
                "epochs": r["epochs"],
            }
            for r, w in zip(ranks, per_rank_wall, strict=True)
        ],
    }
    return out


def _epoch_rate(ranks: list[dict[str, Any]], epoch: int) -> float | None:
    """Epoch ``epoch``'s samples of all ranks / its slowest rank's wall clock (from iter())."""
    wall = max(r["epochs"][epoch]["wall_s"] for r in ranks)
    samples = sum(r["epochs"][epoch]["samples"] for r in ranks)
    return round(samples / wall, 2) if wall > 0 else None


def _collate_cpu_us(ranks: list[dict[str, Any]], samples: int) -> float | None:
    """The collate side's CPU microseconds per emitted sample (odb cells; else None)."""
    stats = [e["odb_stats"] for r in ranks for e in r["epochs"] if "odb_stats" in e]
    if not stats or not samples:
        return None
    return round(1e6 * sum(s["collate_cpu_s"] for s in stats) / samples, 1)


def compare(plain: dict[str, Any], odb: dict[str, Any]) -> dict[str, Any]:
    """odb relative to plain in one (proxy, W)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {
        "samples_per_s_odb_vs_plain": ratio(odb["samples_per_s"], plain["samples_per_s"]),
        "peak_uss_odb_vs_plain": ratio(odb["peak_uss_mb"], plain["peak_uss_mb"]),
        "peak_anon_shm_odb_vs_plain": ratio(odb["peak_anon_shm_mb"], plain["peak_anon_shm_mb"]),
        "first_batch_s_plain_odb": [plain["first_batch_s"], odb["first_batch_s"]],
        "steps_plain_odb": [plain["steps"], odb["steps"]],
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median samples/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]


def table(results: dict[str, Any]) -> str:
    """A markdown table of the headline numbers, one row per odb variant (the JSON holds
    everything)."""
    lines = [
        "| proxy | W | odb variant | samples/s plain / odb (ratio) | first batch s plain / "
        "odb | peak MB (anon + shm) plain / odb | padding eff. plain / odb | steps plain / odb "
        "| collate CPU us/sample |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results.values():
        p = cell["plain"]
        for variant in _VARIANTS:
            if variant not in cell:
                continue
            o, c = cell[variant], cell[f"{variant}_vs_plain"]
            paired = c.get("samples_per_s_ratio_per_repeat", [])
            each = f"; repeats {' / '.join(f'{x}x' for x in paired)}" if len(paired) > 1 else ""
            lines.append(
                f"| {cell['proxy']} | {cell['world_size']} | {variant} | {p['samples_per_s']} / "
                f"{o['samples_per_s']} ({c['samples_per_s_odb_vs_plain']}x{each}) | "
                f"{p['first_batch_s']:.2f} / {o['first_batch_s']:.2f} | "
                f"{p['peak_anon_shm_mb']:.0f} / {o['peak_anon_shm_mb']:.0f} | "
                f"{p['padding_efficiency']} / {o['padding_efficiency']} | "
                f"{p['steps']} / {o['steps']} | {o['collate_cpu_us_per_sample']} |"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def _check_args(args: Any, parser: Any) -> None:
    for name in args.proxies:
        if name not in PROXY_NAMES:
            parser.error(f"unknown proxy {name!r}; choose from {PROXY_NAMES}")
    for world in args.world:
        if world < 1:
            parser.error(f"--world {world}: every world size must be >= 1")
        if args.samples % world:
            # DistributedSampler would repeat samples to even the ranks out.
            parser.error(
                f"--samples {args.samples} is not divisible by W={world}; the plain "
                "DataLoader's DistributedSampler would repeat samples. Use a multiple of "
                f"{math.lcm(*args.world)}"
            )
    for name in ("samples", "budget", "epochs", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    if args.mem_interval_ms <= 0 or args.smaps_interval_ms < 0:
        parser.error(
            "--mem-interval-ms must be > 0 and --smaps-interval-ms >= 0 (0: no USS/PSS), "
            f"got {args.mem_interval_ms} and {args.smaps_interval_ms}"
        )
    if not args.processor.exists():
        parser.error(
            f"--processor {args.processor} does not exist; build the data assets "
            "(`make reproduce`, or experiments.data.assets) or point --processor at them"
        )


def _odb_options(pairs: list[str], workers: int, parser: Any) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` pairs as ODBConfig options, checked against its fields now (with
    ``--workers`` as ``num_workers``, which --odb may not set)."""
    import yaml

    import odb

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            parser.error(f"--odb takes KEY=VALUE pairs, got {pair!r}")
        options[key] = yaml.safe_load(value)
    if "num_workers" in options:
        parser.error("--odb: set num_workers with --workers (both loaders use it)")
    try:
        odb.ODBConfig.from_options(8192, None, {**options, "num_workers": workers})
    except (TypeError, ValueError) as exc:
        parser.error(f"--odb: {exc}")
    return tuple(options.items())


def _add_workload_args(p: Any) -> None:
    """What the cells run: the data, the loaders, the world sizes and the repeats."""
    p.add_argument("--samples", type=int, default=300, help="samples per epoch (all ranks)")
    p.add_argument("--budget", type=int, default=8192, help="odb token budget")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (both)")
    p.add_argument("--proxies", nargs="+", default=list(PROXY_NAMES))
    p.add_argument(
        "--loaders",
        nargs="+",
        default=list(LOADERS),
        choices=LOADERS,
        help="which loaders to run (plain always runs: the others are compared with it)",
    )
    p.add_argument("--world", type=int, nargs="+", default=[1, 2])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every loader per cell, alternating; the table gives the median run "
        "and each repeat's paired ratio",
    )
    p.add_argument(
        "--pixels",
        choices=["uint8", "float32"],
        default="uint8",
        help="how samples carry pixel_values (DataConfig.pixels; uint8 is the default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxies-dir", type=Path, default=Path("results/data/proxies"))
    p.add_argument("--processor", type=Path, default=Path("results/data/assets/processor"))
    p.add_argument(
        "--max-pixels",
        type=int,
        default=0,
        help="pixel budget for every proxy; 0: each proxy's own (default_max_pixels)",
    )
    p.add_argument("--cutoff-len", type=int, default=16384)


def _add_measurement_args(p: Any) -> None:
    """How a cell is sampled, reported and bounded in time."""
    p.add_argument(
        "--mem-interval-ms",
        type=float,
        default=50.0,
        help="sampling interval of anon + shm (/proc/meminfo; costs nothing)",
    )
    p.add_argument(
        "--smaps-interval-ms",
        type=float,
        default=0.0,
        help="sampling interval of USS / PSS (walks every page table, so it slows the "
        "loaders measured); 0 (default): do not sample them",
    )
    p.add_argument("--progress-s", type=float, default=10.0, help="rank progress interval")
    p.add_argument("--timeout", type=float, default=1800.0, help="hard limit per cell, s")


def _add_odb_and_consumer_args(p: Any) -> None:
    """odb's own options and the consumer's simulated work per token."""
    p.add_argument(
        "--odb",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="ODBConfig options for odb (values read as YAML), e.g. collate_mode=thread",
    )
    p.add_argument(
        "--consumer-us-per-token",
        type=float,
        default=0.0,
        help="the consumer busies the GIL this long per real token of each batch "
        "(pure Python; 0: a consumer that does nothing)",
    )


def _cell_spec(args: Any, proxy: str, loader: str, max_pixels: int, odb_options) -> CellSpec:
    """What every rank of one run of ``loader`` on ``proxy`` runs, from the flags."""
    return CellSpec(
        proxy=proxy,
        source=proxy_source(args.proxies_dir, proxy),
        processor=str(args.processor),
        loader=loader,
        samples=args.samples,
        budget=args.budget,
        workers=args.workers,
        epochs=args.epochs,
        max_pixels=max_pixels,
        cutoff_len=args.cutoff_len,
        seed=args.seed,
        progress_s=args.progress_s,
        odb_options=odb_options,
        consumer_us_per_token=args.consumer_us_per_token,
        pixels=args.pixels,
    )


def _run_logged(args: Any, spec: CellSpec, world: int, label: str) -> dict[str, Any]:
    """`run_cell` with the flags' intervals and limit, its start and summary on stderr."""
    _io.progress(f"{label}: starting {world} rank(s)")
    r = run_cell(
        spec, world, args.mem_interval_ms / 1000, args.timeout, args.smaps_interval_ms / 1000
    )
    _io.progress(
        f"{label}: {r['samples']} samples in {r['wall_s']:.1f} s, "
        f"{r['samples_per_s']} samples/s, first batch {r['first_batch_s']:.2f} s, "
        f"peak {r['peak_anon_shm_mb']:.0f} MB (anon + shm), "
        f"padding {r['padding_efficiency']}, "
        f"{r['steps']} steps"
    )
    return r


def _proxy_world(args: Any, proxy: str, world: int, max_pixels: int, odb_options) -> dict:
    """One (proxy, W): every loader ``--repeat`` times, alternating; each loader's median
    run (and every run, with repeats) and each odb variant against plain."""
    runs: dict[str, list[dict[str, Any]]] = {}
    # Repeats alternate the loaders (plain, odb, ..., plain, odb, ...), so a slow
    # spell of the machine lands on both; each ratio pairs one repeat's runs.
    for rep in range(args.repeat):
        for name in ["plain", *(n for n in args.loaders if n != "plain")]:
            label = f"{proxy} W={world} {name}" + (
                f" (repeat {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
            )
            spec = _cell_spec(args, proxy, name, max_pixels, odb_options)
            runs.setdefault(name, []).append(_run_logged(args, spec, world, label))
    cell: dict[str, Any] = {"proxy": proxy, "world_size": world}
    for name, rs in runs.items():
        cell[name] = median_run(rs)
        if args.repeat > 1:
            cell[f"{name}_runs"] = rs
    for variant in _VARIANTS:
        if variant in cell:
            cell[f"{variant}_vs_plain"] = compare(cell["plain"], cell[variant])
            cell[f"{variant}_vs_plain"]["samples_per_s_ratio_per_repeat"] = [
                compare(p, o)["samples_per_s_odb_vs_plain"]
                for p, o in zip(runs["plain"], runs[variant], strict=True)
            ]
    return cell


def _document(args: Any, odb_options, proxies: dict, text: str, results: dict) -> dict:
    """The benchmark's JSON document: the machine, every setting, the table, the cells."""
    return {
        "benchmark": "real_pipeline",
        "machine": _io.machine(),
        "settings": {
            "samples_per_epoch": args.samples,
            "epochs": args.epochs,
            "token_budget": args.budget,
            "num_workers": args.workers,
            "world_sizes": args.world,
            "seed": args.seed,
            "cutoff_len": args.cutoff_len,
            "pixels": args.pixels,
            "repeat": args.repeat,
            "processor": str(args.processor),
            "proxies": proxies,
            "odb": {
                "options": dict(odb_options),
                "variants": _VARIANTS,
                "otherwise": "ODBLoader defaults",
            },
            "plain": "DataLoader(batch_size=1, DistributedSampler(shuffle=True))",
            "collate": "experiments.data.pipeline.collate (pad id of the tokenizer)",
            "consumer": "counts samples and tokens; busy pure-Python "
            f"{args.consumer_us_per_token} us per real token",
            "ranks": "spawned, Gloo over TCP on 127.0.0.1 (harness.ranks.run_ranks)",
        },
        "table_markdown": text,
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = _io.parser(__doc__.splitlines()[0])
    _add_workload_args(p)
    _add_measurement_args(p)
    _add_odb_and_consumer_args(p)
    args = p.parse_args(argv)
    odb_options = _odb_options(args.odb, args.workers, p)
    _check_args(args, p)

    results: dict[str, Any] = {}
    proxies: dict[str, Any] = {}
    for proxy in args.proxies:
        max_pixels = args.max_pixels or default_max_pixels(proxy)
        proxies[proxy] = {
            "image_max_pixels": max_pixels,
            "source": proxy_source(args.proxies_dir, proxy),
        }
        for world in args.world:
            cell = _proxy_world(args, proxy, world, max_pixels, odb_options)
            results[f"{proxy}/W{world}"] = cell
    text = table(results)
    _io.progress("summary:\n" + text)
    doc = _document(args, odb_options, proxies, text, results)
    _io.emit(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
