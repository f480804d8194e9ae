"""REPORT.md's section on the step-cost model: its held-out rows beside the paper's numbers.

Reads ``docs/bench/plan_heldout.json`` under the report's root (made by ``python -m
bench.plan_heldout``): every row the model predicted without being fitted to it, with the
published figure and the error. The model and what each error says: ``docs/plan.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

HELDOUT = Path("docs/bench/plan_heldout.json")


def section(root: Path) -> list[str]:
    """The section's Markdown lines (a note instead when the comparison was not made)."""
    head = ["## The step-cost model against published measurements (held out)", ""]
    path = root / HELDOUT
    if not path.is_file():
        return [*head, f"Not made here: `{HELDOUT}` is absent (python -m bench.plan_heldout).", ""]
    data = json.loads(path.read_text())
    constants = data["constants"]
    lines = [
        *head,
        f"Two constants fitted on {data['fitted_on']}: peak_mfu {constants['peak_mfu']}, "
        f"step_overhead_s {constants['step_overhead_s']}. Every row below was predicted "
        "without being fitted to; docs/plan.md says what each error above 25% lacks.",
        "",
        "| row | unit | predicted | published | error |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['what']} | {r['unit']} | {r['predicted']:,} | {r['published']:,} | "
        f"{r['error']:+.0%} |"
        for r in data["rows"]
    ]
    return [*lines, ""]
