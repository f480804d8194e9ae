"""What every paper script shares: read the grid manifest and result JSON, write tables.

A paper script turns result files into one table (Markdown, LaTeX and the table's data
as JSON, which the report reads) and, for some, one figure. It reads files only: no
torch, no training code. The manifest (``results/paper/grid.json``, written by
``python -m experiments.grid manifest``) says which cells a table needs; a missing
result fails the script with the list of missing cells, unless ``--allow-partial`` is
given: then the table is made from what exists and names the missing cells under it.

Timings and the claim rule are `paper.claims`'s; the cells ablation tables share are
`paper.cells`'s.

Every script has the same command line::

    python -m paper.<table> --grid results/paper/grid.json --out-dir results/paper \\
        [--root .] [--allow-partial]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

METHOD_ORDER = ("standard", "sorted", "gmt", "bmt", "packing", "odb")
METHOD_LABEL = {
    "standard": "Standard",
    "sorted": "Sorted",
    "gmt": "GMT",
    "bmt": "BMT",
    "packing": "Packing",
    "odb": "ODB",
}
DATASET_LABEL = {
    "ultrachat": "UltraChat",
    "llava": "LLaVA",
    "sharegpt4o": "ShareGPT4o",
    "mmmix": "MM-Mix",
}
DATASET_ORDER = tuple(DATASET_LABEL)


class IncompleteGridError(RuntimeError):
    """A table's cells are not all there (and partial tables were not asked for)."""


@dataclass
class Run:
    """One cell of the grid with its train result and its evaluations (when present)."""

    name: str
    cell: dict[str, Any]
    result: dict[str, Any]
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.cell[key]

    @property
    def setting(self) -> str:
        """Model, mode and nodes, e.g. ``2b full 1N``."""
        return f"{self.cell['model']} {self.cell['mode']} {self.cell['nodes']}N"

    @property
    def throughput(self) -> float:
        return float(self.result["throughput_samples_per_s"])

    def loader(self, key: str, default: Any = None) -> Any:
        return self.result.get("loader_stats", {}).get(key, default)


@dataclass
class Collected:
    """The runs of one table and the cells it is missing."""

    grid: dict[str, Any]
    runs: list[Run]
    missing: list[str]

    def find(self, **attrs: Any) -> list[Run]:
        """Runs whose cell attributes equal ``attrs`` (``options`` compares as a dict)."""
        return [r for r in self.runs if all(r.cell.get(k) == v for k, v in attrs.items())]

    def counterpart(self, run: Run, **changes: Any) -> Run | None:
        """The run whose cell equals ``run``'s but for ``changes`` (same seed unless
        changed), or None. ``counterpart(gmt_run, method="odb")`` is ODB in GMT's cell."""
        want = {k: v for k, v in run.cell.items() if k not in ("result", "evals")}
        want.update(changes)
        found = self.find(**want)
        return found[0] if found else None

    def reference(self, run: Run, method: str = "standard") -> Run | None:
        """The run of ``method`` with ``run``'s data, model, mode, nodes, seed and epochs,
        the dataset's default budget and no options (the speedup reference)."""
        return self.counterpart(run, method=method, options={}, budget=run["default_budget"])


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--grid", type=Path, required=True, help="the grid manifest (JSON)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        required=True,
        help="writes tables/<name>.{md,tex,json} and figures/<name>.png here",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="folder the manifest's result paths are relative to",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="make the table from the results that exist; list the missing",
    )
    return parser.parse_args(argv)


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        message = f"{path} is not valid JSON ({exc}); rerun the rule that writes it"
        raise ValueError(message) from None


def collect(args: argparse.Namespace, table: str, evals: bool = False) -> Collected:
    """Load the runs of ``table``; fail on missing files unless ``--allow-partial``."""
    grid = _read(args.grid)
    names = grid["tables"].get(table)
    if names is None:
        raise KeyError(f"{args.grid} has no table {table!r}; tables: {sorted(grid['tables'])}")
    runs, missing = [], []
    for name in names:
        cell = grid["cells"][name]
        path = args.root / cell["result"]
        wanted = cell["evals"] if evals else {}
        absent = [p for p in [cell["result"], *wanted.values()] if not (args.root / p).exists()]
        if absent:
            missing.append(name)
            continue
        run = Run(name, cell, _read(path))
        run.evals = {b: _read(args.root / p) for b, p in wanted.items()}
        runs.append(run)
    if missing and not args.allow_partial:
        shown = "\n  ".join(missing[:20]) + ("\n  ..." if len(missing) > 20 else "")
        raise IncompleteGridError(
            f"table {table}: {len(missing)} of {len(names)} cells have no results:\n  {shown}\n"
            f"Run them (snakemake table_{table}), or pass --allow-partial (config "
            "allow_partial: true) to make the table from the cells that exist"
        )
    return Collected(grid, runs, missing)


def mean(values: Iterable[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else math.nan


def mean_std(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """``12.34`` for one value, ``12.34 ± 0.56`` over seeds, ``–`` for none."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def group(runs: Iterable[Run], key: Callable[[Run], Any]) -> dict[Any, list[Run]]:
    out: dict[Any, list[Run]] = {}
    for run in runs:
        out.setdefault(key(run), []).append(run)
    return out


def sort_key(run: Run) -> tuple:
    cell = run.cell
    dataset = DATASET_ORDER.index(cell["dataset"]) if cell["dataset"] in DATASET_ORDER else 9
    method = METHOD_ORDER.index(cell["method"])
    return (
        dataset,
        cell["data"],
        cell["model"],
        cell["mode"],
        cell["nodes"],
        method,
        cell["budget"],
        json.dumps(cell["options"], sort_keys=True),
        cell["seed"],
    )


def write_table(
    args: argparse.Namespace,
    name: str,
    df: pd.DataFrame,
    title: str,
    notes: Sequence[str] = (),
    missing: Sequence[str] = (),
    data: Any = None,
) -> dict[str, Path]:
    """Write ``tables/<name>.md``, ``.tex`` and ``.json`` (``data``: what the report reads).

    The Markdown opens with the title and the scale, and ends with the notes and, for a
    partial grid, the missing cells.
    """
    out = args.out_dir / "tables"
    out.mkdir(parents=True, exist_ok=True)
    grid = _read(args.grid)
    lines = [f"### {title}", "", f"Scale: **{grid['scale']}**.", ""]
    lines.append(df.to_markdown(index=False) if len(df) else "_No results._")
    lines.append("")
    lines += [f"{note}" for note in notes]
    if missing:
        lines += [
            "",
            f"**Incomplete grid: {len(missing)} cell(s) missing:** "
            + ", ".join(f"`{m}`" for m in missing),
        ]
    paths = {"md": out / f"{name}.md", "tex": out / f"{name}.tex", "json": out / f"{name}.json"}
    paths["md"].write_text("\n".join(lines).rstrip() + "\n")
    latex = df.to_latex(
        index=False, caption=f"{title} ({grid['scale']} scale)", label=f"tab:{name}", escape=True
    )
    paths["tex"].write_text(latex)
    payload = {
        "table": name,
        "title": title,
        "scale": grid["scale"],
        "missing": list(missing),
        "rows": df.to_dict(orient="records"),
        "data": data if data is not None else {},
    }
    paths["json"].write_text(json.dumps(payload, indent=1, sort_keys=True, default=str) + "\n")
    return paths


def figure_path(args: argparse.Namespace, name: str) -> Path:
    out = args.out_dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}.png"


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "svg.hashsalt": "odb"})
    return plt


def yerr(spreads: Sequence[Mapping[str, Any] | None]) -> list[list[float]]:
    """matplotlib's asymmetric error bars (median to min, median to max) of
    ``Spread.to_dict()`` values; 0 where there is none."""
    ok = [s if s and s["n"] else None for s in spreads]
    return [
        [s["median"] - s["low"] if s else 0.0 for s in ok],
        [s["high"] - s["median"] if s else 0.0 for s in ok],
    ]


def save_figure(fig: Any, path: Path) -> None:
    # no timestamp in the file, so equal inputs give equal bytes
    fig.savefig(path, metadata={"Software": None}, bbox_inches="tight")


def scale_note(grid: Mapping[str, Any]) -> str:
    if grid["scale"] == "paper":
        return ""
    return (
        f"_{grid['scale']} numbers: tiny model on proxy data, not the paper's GPU "
        "numbers; read directions, not magnitudes._"
    )
