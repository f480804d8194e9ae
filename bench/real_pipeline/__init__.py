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

The package: ``memory`` (the machine's and the process tree's memory, sampled),
``rank`` (what one rank of a cell runs), ``cell`` (a cell on fresh ranks, summarised),
``report`` (paired ratios, medians, the table), ``cli`` (the command line).

    python -m bench.real_pipeline --samples 240 --world 1 2 --out results/bench/real_pipeline.json

Needs the data assets of ``make reproduce`` (``results/data/proxies`` and
``results/data/assets/processor``), or ``--proxies-dir`` / ``--processor``.
"""

from __future__ import annotations

from bench.real_pipeline.cli import main
from bench.real_pipeline.memory import TreeMemorySampler, machine_memory_bytes, machine_shmem_bytes
from bench.real_pipeline.report import median_run

__all__ = ["TreeMemorySampler", "machine_memory_bytes", "machine_shmem_bytes", "main", "median_run"]
