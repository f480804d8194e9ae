"""``bench.shm_recycling`` small: both modes run through ODB's real worker pickling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.shm_recycling import main


def test_small_run_reuses_slabs_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "shm.json"
    main(["--items", "12", "--mb", "2", "--window", "3", "--repeats", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    rows = {(r["mode"], r["window"]): r for r in doc["rows"]}
    assert set(rows) == {("fresh", 2), ("fresh", 3), ("slabs", 3)}
    assert rows[("fresh", 3)]["reused_fraction"] == 0.0
    # The consumer keeps 3 items and the queue 4, so 12 items need at most ~8 slabs.
    assert rows[("slabs", 3)]["reused_fraction"] > 0.2
    for row in rows.values():
        assert row["items"] == 12 and row["producer_minor_faults"] > 0
