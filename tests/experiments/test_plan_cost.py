"""PLAN.json from the step-cost model: every cell its own figure (issue 58's acceptance)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from experiments.grid import build_grid
from experiments.plan import build_plan
from experiments.workflow_config import PAPER_CONFIG, load_files


@pytest.fixture(scope="module")
def cells() -> list[dict[str, Any]]:
    config = load_files(PAPER_CONFIG)
    grid = build_grid(config)
    rows = build_plan(config)["cells"]
    for row in rows:
        cell = grid.cells[row["cell"]]
        row["key"] = (cell.data, row["method"], row["nodes"], row["token_budget"], row["cell"])
        row["size"] = cell.model
    return rows


def _main(row: dict[str, Any]) -> bool:
    return row["cell"].endswith(("-s0", "-s1", "-s2")) and ".b" not in row["cell"]


def test_every_cell_has_a_prediction(cells: list[dict[str, Any]]) -> None:
    assert all(r["samples_per_s"] and r["samples_per_s"] > 0 for r in cells)
    assert all(r["gpu_hours"] and r["gpu_hours"] > 0 for r in cells)


def test_2b_costs_less_than_8b_and_lora_differs_from_full(cells: list[dict[str, Any]]) -> None:
    by: dict[tuple[Any, ...], dict[str, float]] = defaultdict(dict)
    for r in cells:
        if _main(r):
            key = (r["key"][0], r["method"], r["nodes"], r["token_budget"])
            by[key][f"{r['size']}-{r['mode']}"] = r["gpu_hours"]
    pairs = [v for v in by.values() if "2b-full" in v and "8b-full" in v]
    assert pairs and all(v["2b-full"] < v["8b-full"] for v in pairs)
    modes = [v for v in by.values() if "8b-lora" in v]
    assert modes and all(v["8b-lora"] != v["8b-full"] for v in modes)


def test_every_odb_budget_has_its_own_figure(cells: list[dict[str, Any]]) -> None:
    sweep = [r for r in cells if ".odb.2b-full-n1-s0.b" in r["cell"]
             and r["cell"].startswith("sharegpt4o.")]  # fmt: skip
    assert len(sweep) >= 4
    assert len({r["samples_per_s"] for r in sweep}) == len(sweep)


def test_methods_differ_where_their_steps_differ(cells: list[dict[str, Any]]) -> None:
    main = {r["cell"]: r["samples_per_s"] for r in cells}
    for data in ("ultrachat", "llava", "sharegpt4o"):
        rates = {m: main[f"{data}.{m}.8b-full-n1-s0"]
                 for m in ("standard", "sorted", "gmt", "bmt", "odb")}  # fmt: skip
        assert len(set(rates.values())) == len(rates), rates
    assert main["ultrachat.packing.8b-full-n1-s0"] != main["ultrachat.gmt.8b-full-n1-s0"]
    # node counts: the same cell on two nodes is its own figure
    assert main["ultrachat.odb.8b-full-n2-s0"] != main["ultrachat.odb.8b-full-n1-s0"]
