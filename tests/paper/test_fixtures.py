"""The paper fixtures checked independently of the paper scripts.

``test_paper.py`` pins the scripts' output to the golden files, which were made by the
same scripts: a regression check, not a correctness one. Here the fixtures are held to
the train result schema (a result a real run could have written), and table cells of
the golden files are recomputed from the fixture JSON with the arithmetic written out
in the test, calling no paper code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden" / "tables"
SCHEMA = HERE.parents[1] / "experiments" / "schemas" / "train_result.json"


def _result(cell: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "results" / "train" / cell / "result.json").read_text())


def _row(table: str, **where: str) -> dict[str, str]:
    rows = json.loads((GOLDEN / f"{table}.json").read_text())["rows"]
    (row,) = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return row


def _spread(values: list[float], digits: int = 2, suffix: str = "") -> str:
    """median [min-max] n=3 of three values, as the tables write them."""
    low, mid, high = sorted(values)
    return f"{mid:.{digits}f}{suffix} [{low:.{digits}f}-{high:.{digits}f}] n=3"


def test_every_fixture_result_is_a_valid_train_result() -> None:
    schema = json.loads(SCHEMA.read_text())
    grid = json.loads((FIXTURES / "grid.json").read_text())
    wanted = {cell["result"] for cell in grid["cells"].values()}
    present = {
        p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "results").rglob("result.json")
    }
    assert present == wanted, "fixture results and grid cells differ"
    validator = jsonschema.Draft202012Validator(schema)
    errors = {
        rel: [e.message for e in validator.iter_errors(json.loads((FIXTURES / rel).read_text()))]
        for rel in sorted(wanted)
    }
    assert not {rel: e for rel, e in errors.items() if e}
    for name, cell in grid["cells"].items():
        result = json.loads((FIXTURES / cell["result"]).read_text())
        assert result["schema"] == schema["$id"]
        assert (result["run_id"], result["method"], result["mode"]) == (
            name, cell["method"], cell["mode"])


def test_the_cache_cost_of_gmt_on_ultrachat_by_hand() -> None:
    """Each measurement (epochs 1-3) with the cache build charged to it: a sample takes
    1/rate + build/emitted seconds; paired with ODB's epoch k; the build's share of a
    sample's time, per measurement; the timed epochs' seconds."""
    gmt, odb = _result("ultrachat.gmt.tiny-full-n1-s0"), _result("ultrachat.odb.tiny-full-n1-s0")
    build = gmt["length_cache"]["build_seconds"]
    per_sample = build / gmt["emitted_samples"]
    incl = [1 / (t["wall_s"] / t["samples"] + per_sample) for t in gmt["epoch_timings"][1:]]
    odb_rates = [t["samples"] / t["wall_s"] for t in odb["epoch_timings"][1:]]
    ratios = [mine / theirs for mine, theirs in zip(incl, odb_rates, strict=True)]
    shares = [100 * per_sample / (t["wall_s"] / t["samples"] + per_sample)
              for t in gmt["epoch_timings"][1:]]
    walls = [t["wall_s"] for t in gmt["epoch_timings"][1:]]
    row = _row("cache", Dataset="UltraChat", Method="GMT")
    assert row["Samples/s incl. cache"] == _spread(incl)
    assert row["incl. cache vs ODB"] == _spread(ratios, suffix="x")
    assert row["Verdict vs ODB"] == ("slower" if max(ratios) < 1 else "not slower")
    assert row["Cache share %"] == _spread(shares, digits=1)
    assert row["Epoch s"] == _spread(walls, digits=1)
    assert row["Cache build s"] == f"{build:.1f} (n=1)"


def test_the_budget_sweep_against_the_default_budget_by_hand() -> None:
    """L_max 4096 against 8192 (both ODB): epoch k's samples/s over the default's."""
    small = _result("ultrachat.odb.tiny-full-n1-s0.b4096")["epoch_timings"][1:]
    default = _result("ultrachat.odb.tiny-full-n1-s0")["epoch_timings"][1:]
    ratios = [
        (s["samples"] / s["wall_s"]) / (d["samples"] / d["wall_s"])
        for s, d in zip(small, default, strict=True)
    ]
    rows = json.loads((GOLDEN / "budget.json").read_text())["rows"]
    (row,) = [r for r in rows if r["L_max"] == 4096]
    assert row["vs default L_max"] == _spread(ratios, suffix="x")
    assert row["Verdict vs default"] == ("slower" if max(ratios) < 1 else "not slower")
    assert row["Samples/s"] == _spread([t["samples"] / t["wall_s"] for t in small])


def test_an_untimed_row_of_the_throughput_table_by_hand() -> None:
    """ShareGPT4o, BMT: one whole-run figure (it timed one epoch), its cost figures."""
    bmt = _result("sharegpt4o.bmt.tiny-full-n1-s0")
    std = _result("sharegpt4o.standard.tiny-full-n1-s0")
    row = _row("throughput", Dataset="ShareGPT4o", Method="BMT")
    assert row["Samples/s"] == f"{bmt['emitted_samples'] / bmt['train_wall_s']:.2f} (n=1)"
    speedup = bmt["throughput_samples_per_s"] / std["throughput_samples_per_s"]
    assert row["Speedup vs Standard"] == f"{speedup:.2f}x (n=1)"
    assert row["Padded tok./sample"] == f"{bmt['padded_tokens'] / bmt['emitted_samples']:.1f}"
    assert row["Padding eff."] == f"{bmt['real_tokens'] / bmt['padded_tokens']:.3f}"
    assert row["Steps"] == str(bmt["steps"])


def test_a_depth_rows_overlap_and_data_wait_by_hand() -> None:
    """LLaVA at D = 4 (1 worker x prefetch 4): each measured epoch's overlap (the warm-up
    dropped) is 1 - its data wait / its time."""
    timed = _result("llava.odb.tiny-full-n1-s0.prefetch_factor-4")["epoch_timings"][1:]
    row = _row("depth", Dataset="LLaVA", D=4)
    overlaps = [100 * (1 - t["data_wait_s"] / t["wall_s"]) for t in timed]
    assert row["Overlap %"] == _spread(overlaps, digits=1)
    assert row["Data wait s"] == _spread([t["data_wait_s"] for t in timed])


def test_a_policy_rows_round_time_by_hand() -> None:
    """The ``paper`` policy's mean alignment round, one figure per measured epoch."""
    timed = _result("ultrachat.odb.tiny-full-n1-s0.policy-paper")["epoch_timings"][1:]
    row = _row("policy", Dataset="UltraChat", Policy="paper")
    assert row["Round ms"] == _spread([t["round_ms"] for t in timed], digits=1)
