"""The plan's report: figures as plain data (JSON-ready), a table, a plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
# Columns of the printed table: (row key, heading, format).
_COLUMNS = (
    ("budget", "budget", "{}"),
    ("world_size", "W", "{}"),
    ("steps", "steps", "{}"),
    ("samples_per_step", "samples/step", "{:.1f}"),
    ("padding_efficiency", "pad eff", "{:.1%}"),
    ("idle_fraction", "IDLE", "{:.2%}"),
    ("standard_steps", "Std steps", "{}"),
    ("standard_padding_efficiency", "Std pad eff", "{:.1%}"),
    ("oracle_steps", "oracle steps", "{}"),
    ("speedup_vs_standard", "speed-up", "x{:.2f}"),
)


@dataclass
class PlanReport:
    """What :func:`odb.plan` found. Every figure is per epoch; ``rows`` has one entry per
    budget x world size. When only a sample was measured (``measured < dataset_size``)
    the figures are the sample's, and ``epoch_scale`` is what steps scale by."""

    dataset_size: int
    measured: int
    seconds: float
    stopped_by_time: bool
    lengths: dict[str, Any]
    rows: list[dict[str, Any]]
    recommendation: dict[int, dict[str, Any]]
    warnings: list[str]
    assumptions: list[str]
    step_cost: dict[str, Any]
    probe: dict[str, Any] | None = None
    worth_it: bool = True
    schema_version: int = SCHEMA_VERSION
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def epoch_scale(self) -> float:
        return self.dataset_size / self.measured

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["recommendation"] = {str(w): r for w, r in self.recommendation.items()}
        out["epoch_scale"] = round(self.epoch_scale, 6)
        return out

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def table(self) -> str:
        """The rows as aligned text, then the lengths, the advice and the assumptions."""
        head = [h for _, h, _ in _COLUMNS]
        body = [[fmt.format(row[key]) for key, _, fmt in _COLUMNS] for row in self.rows]
        widths = [max(len(c) for c in column) for column in zip(head, *body, strict=False)]
        lines = [
            "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
            for cells in [head, *body]
        ]
        return "\n".join([self._lengths_line(), "", *lines, "", *self._advice_lines()])

    def _lengths_line(self) -> str:
        s = self.lengths
        sampled = "" if self.measured == self.dataset_size else f" of {self.dataset_size}"
        return (
            f"lengths of {self.measured}{sampled} samples: mean {s['mean']}, CV {s['cv']}, "
            f"short (< {s['short_threshold']}) {s['short_fraction']:.1%}, p50 {s['p50']}, "
            f"p90 {s['p90']}, p99 {s['p99']}, max {s['max']}; over the cutoff "
            f"{s['cutoff']}: {s['over_cutoff_fraction']:.1%}"
        )

    def _advice_lines(self) -> list[str]:
        lines = [
            f"recommended at {w} rank(s): budget {r['budget']}: {r['reason']}"
            for w, r in self.recommendation.items()
        ]
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"assumed: {a}" for a in self.assumptions]
        return lines


def plot(report: PlanReport, path: Path) -> None:
    """Padding efficiency and predicted speed-up vs budget, one line per world size
    (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (pad, speed) = plt.subplots(1, 2, figsize=(9, 3.5))
    for world_size in sorted({r["world_size"] for r in report.rows}):
        rows = [r for r in report.rows if r["world_size"] == world_size]
        budgets = [r["budget"] for r in rows]
        pad.plot(
            budgets, [r["padding_efficiency"] for r in rows], marker="o", label=f"W={world_size}"
        )
        speed.plot(
            budgets, [r["speedup_vs_standard"] for r in rows], marker="o", label=f"W={world_size}"
        )
    for ax, label in ((pad, "padding efficiency"), (speed, "predicted speed-up vs Standard")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("odb.plan (an estimate: step cost a + b x tokens)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
