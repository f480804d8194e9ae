"""Memory of the machine and of this process tree, sampled while a cell runs."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

MB = 1 << 20


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


def own_uss_mb() -> float:
    me = psutil.Process(os.getpid())
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().uss
        except psutil.Error:
            pass
    return round(total / MB, 1)
