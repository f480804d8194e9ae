"""REPORT.md's held-out section: the committed comparison's rows, or a note without it."""

from __future__ import annotations

import json
from pathlib import Path

from paper import heldout

ROOT = Path(__file__).resolve().parents[2]


def test_the_section_lists_every_committed_row() -> None:
    lines = heldout.section(ROOT)
    rows = json.loads((ROOT / heldout.HELDOUT).read_text())["rows"]
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| row")]
    assert len(table) == len(rows)
    assert any("torchtitan" in line and "5,762" in line for line in table)
    assert any("peak_mfu" in line for line in lines)


def test_without_the_comparison_the_section_says_so(tmp_path: Path) -> None:
    assert any("Not made here" in line for line in heldout.section(tmp_path))
