"""odb.plan on the artifact's four datasets, through the real Qwen3-VL pipeline: its
forecast is the real loader's epoch at W = 1, 2, 4, 8, and the command runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from torch.utils.data import Subset

import odb
from experiments.data import plan as data_plan
from experiments.data.proxy_plans import PROXY_NAMES
from harness.ranks import run_ranks
from tests.odb.planning.loader_figures import FIGURES, epoch_figures, summed
from tests.odb.planning.test_plan import SCHEMA

WORLD_SIZES = (1, 2, 4, 8)
BUDGET = 8192
RECORDS = 120  # of each small proxy: ShareGPT4o's large images make every read dear


@pytest.fixture(scope="module")
def proxies(datasets_by_name: dict) -> dict[str, Subset]:
    return {name: Subset(ds, range(RECORDS)) for name, ds in datasets_by_name.items()}


@pytest.fixture(scope="module")
def lengths(datasets_by_name: dict) -> dict[str, list[int]]:
    """The pipeline's own lengths of those records (``PreprocessedDataset.length``)."""
    return {name: [int(ds.length(i)) for i in range(RECORDS)]
            for name, ds in datasets_by_name.items()}  # fmt: skip


@pytest.fixture(scope="module")
def reports(proxies: dict) -> dict[str, odb.planning.PlanReport]:
    """Each proxy planned from its samples read through the pipeline's __getitem__."""
    return {
        name: odb.plan(dataset, budgets=[BUDGET], world_sizes=WORLD_SIZES, num_samples=None,
                       progress=False)
        for name, dataset in proxies.items()
    }  # fmt: skip


def test_the_plan_measures_the_pipelines_lengths(lengths: dict, reports: dict) -> None:
    for name, measured in lengths.items():
        lengths = np.asarray(measured)
        report = reports[name]
        assert report.measured == len(lengths) and report.lengths["max"] == lengths.max()
        assert report.lengths["mean"] == pytest.approx(lengths.mean(), abs=0.01)
        row = next(r for r in report.rows if r["world_size"] == 1)
        assert row["real_tokens"] == lengths.sum()


@pytest.mark.dist
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_forecast_is_the_real_loaders_epoch_on_each_proxy(
    world_size: int, lengths: dict, reports: dict
) -> None:
    # The real loader (thread mode: the same round driver and collectives, lighter than
    # W x 2 processes on 2 cores) reads samples of the pipeline's lengths, same seed.
    options = {"token_budget": BUDGET, "collate_mode": "thread"}
    per_rank = run_ranks(epoch_figures, world_size, lengths, options, timeout=240)
    for name in PROXY_NAMES:
        row = next(r for r in reports[name].rows if r["world_size"] == world_size)
        assert {k: row[k] for k in FIGURES} == summed([r[name] for r in per_rank]), name


def test_the_command_plans_a_proxy(tmp_path: Path, small_proxy_root: Path,
                                   small_processor_dir: Path, monkeypatch) -> None:
    """``python -m experiments.data.plan`` on the workflow's proxies and assets."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "data").mkdir(parents=True)
    os.symlink(small_proxy_root, tmp_path / "results" / "data" / "proxies")
    (tmp_path / "results" / "data" / "assets").mkdir()
    os.symlink(small_processor_dir, tmp_path / "results" / "data" / "assets" / "processor")
    report = data_plan.main(["--data", "llava", "--world-sizes", "1", "2", "--workers", "0"])
    written = json.loads((tmp_path / "results" / "plan" / "llava.json").read_text())
    jsonschema.validate(written, SCHEMA)
    assert written == json.loads(json.dumps(report))
    assert [r["budget"] for r in written["rows"]][::2] == [4096, 8192, 16384, 32768]
    assert written["lengths"]["cutoff"] == 4096  # the CPU config's cutoff for LLaVA
    assert (tmp_path / "results" / "plan" / "llava.png").exists()


def test_an_unknown_dataset_names_the_configs_variants() -> None:
    with pytest.raises(SystemExit, match="the config's data variants are"):
        data_plan.main(["--data", "imagenet"])
