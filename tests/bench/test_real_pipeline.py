"""``bench.real_pipeline`` on a tiny MM-Mix proxy: real ranks, real pipeline, one JSON.

Only bounds that do not depend on the machine's speed are asserted: every sample is
emitted once per loader, padding efficiency is a fraction, odb never takes more steps
than one-sample batches, and the sampled memory is positive; the machine's anonymous and
shared memory, which the anon + shm figure adds, count what a process writes there.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.real_pipeline import (
    TreeMemorySampler,
    machine_memory_bytes,
    machine_shmem_bytes,
    main,
    median_run,
)
from experiments.data.assets import build_image_processor, corpus_from_proxies, train_tokenizer
from experiments.data.proxies import write_proxy
from experiments.data.proxy_plans import ProxyConfig

SAMPLES = 12


@pytest.mark.dist
@pytest.mark.slow
# The cell's USS and PSS sum this process's descendants, which pooled ranks are not.
@pytest.mark.fresh_ranks
def test_tiny_run_reports_every_cell(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    proxies = tmp_path / "proxies"
    write_proxy(ProxyConfig("mmmix", num_samples=40, seed=0), proxies / "mmmix")
    processor = tmp_path / "processor"
    train_tokenizer(corpus_from_proxies(proxies), processor, vocab_size=2000)
    build_image_processor(768 * 768).save_pretrained(processor)
    out = tmp_path / "real_pipeline.json"

    main(
        [
            "--samples", str(SAMPLES), "--proxies", "mmmix", "--world", "1",
            "--workers", "0", "--proxies-dir", str(proxies), "--processor", str(processor),
            "--out", str(out), "--timeout", "120", "--smaps-interval-ms", "100",
        ]
    )  # fmt: skip

    doc = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == doc  # stdout and --out agree
    assert doc["machine"]["scale"] == "CPU-proxy scale"
    cell = doc["results"]["mmmix/W1"]
    plain, odb, thread = cell["plain"], cell["odb"], cell["odb-thread"]
    for r in (plain, odb, thread):
        assert r["samples"] == SAMPLES
        assert sum(p["samples"] for p in r["per_rank"]) == SAMPLES
        assert 0 < r["padding_efficiency"] <= 1
        assert r["peak_uss_mb"] > 0 and r["peak_pss_mb"] > 0 and r["smaps_samples"] > 0
        assert r["memory_samples"] >= r["smaps_samples"]
        assert r["peak_anon_shm_mb"] > 0
        assert r["samples_per_s"] > 0 and 0 <= r["first_batch_s"] <= r["wall_s"]
        assert r["samples_per_s_per_epoch"] == [r["samples_per_s"]]  # one epoch
    assert plain["steps"] == SAMPLES and plain["padding_efficiency"] == 1.0
    assert 1 <= odb["steps"] <= plain["steps"] and thread["steps"] == odb["steps"]
    assert plain["collate_cpu_us_per_sample"] is None
    assert odb["collate_cpu_us_per_sample"] > 0 and thread["collate_cpu_us_per_sample"] > 0
    stats = odb["per_rank"][0]["epochs"][0]["odb_stats"]
    assert stats["samples"] == SAMPLES and stats["steps"] == odb["steps"]
    assert stats["padding_efficiency"] == pytest.approx(odb["padding_efficiency"], abs=1e-4)
    assert cell["odb_vs_plain"]["steps_plain_odb"] == [SAMPLES, odb["steps"]]
    assert "| odb-thread |" in doc["table_markdown"]


def _own_rss_bytes() -> dict[str, int]:
    """This process's resident anonymous and shared pages (``/proc/self/status``)."""
    wanted = {"RssAnon:": "anon", "RssShmem:": "shmem"}
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = wanted.get(line.split(maxsplit=1)[0])
            if key:
                found[key] = int(line.split()[1]) * 1024
    return found


# The machine's counters are machine-wide: any other process may free memory between
# two readings and hide a growth. Two facts hold in every interleaving instead: this
# process's own counters (no other process changes them) grow by what it writes, and
# the machine's counter, which counts every process's pages once, is never below this
# process's share while it holds the pages.


def test_shared_memory_nobody_touches_counts_in_anon_plus_shm() -> None:
    """Shared memory counts once it is written, whoever maps it (a worker's pixels)."""
    before = _own_rss_bytes()["shmem"]
    pixels = torch.ones(16 << 20, dtype=torch.uint8).share_memory_()  # written: resident
    own = _own_rss_bytes()["shmem"]
    assert own - before >= (8 << 20)  # the written pages are shared ones
    assert machine_shmem_bytes() >= own  # and the machine's Shmem counts them
    del pixels


def test_anonymous_memory_counts_once_written() -> None:
    """The anon part of anon + shm is the machine's AnonPages: a touched mapping shows.

    The pages come from a fresh private anonymous mapping (a shared one is Shmem): a
    malloc'd buffer may reuse pages already resident in this process's heap (earlier
    tests' frees), which add nothing.
    """
    size = 128 << 20
    before = _own_rss_bytes()["anon"]
    with mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as fresh:
        np.frombuffer(fresh, dtype=np.uint8)[:] = 1  # written: resident
        own = _own_rss_bytes()["anon"]
        assert own - before >= size // 2, f"RssAnon grew by {own - before} for 128 MiB"
        assert machine_memory_bytes()["anon"] >= own


def test_sampler_refuses_a_zero_interval() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        TreeMemorySampler(0.0)
    with pytest.raises(ValueError, match="smaps_interval_s >= 0"):
        TreeMemorySampler(0.05, smaps_interval_s=-1.0)


def test_median_run_is_the_middle_by_samples_per_s() -> None:
    runs = [{"samples_per_s": v, "id": i} for i, v in enumerate([5.0, 1.0, 3.0, 4.0])]
    assert median_run(runs[:3])["id"] == 2  # 1, 3, 5 -> 3
    assert median_run(runs)["id"] == 2  # the lower middle of 1, 3, 4, 5
    assert median_run(runs[:1])["id"] == 0
