"""What every paper script shares: read the grid manifest and result JSON, write tables.

A paper script turns result files into one table (Markdown, LaTeX and the table's data
as JSON, which the report reads) and, for some, one figure. It reads files only: no
torch, no training code. The manifest (``results/paper/grid.json``, written by
``python -m experiments.grid manifest``) says which cells a table needs; a missing
result fails the script with the list of missing cells, unless ``--allow-partial`` is
given: then the table is made from what exists and names the missing cells under it.

Timings are repeated measurements, never one number: :func:`measurements` says what a
measurement is (each whole epoch after a warm-up epoch; the seeds of a cell add more),
:func:`pairings` pairs a run's measurements with its reference's by position,
:class:`Spread` is the one cell format of a timing or a ratio (``2.10x [1.98-2.24] n=3``)
and :func:`verdict` is the one rule by which a table or the report says "faster",
"slower" or "within noise".

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


# -- measurements, their spread and the claim rule -------------------------------------

MIN_PAIRINGS = 3
FASTER, SLOWER, WITHIN_NOISE, TOO_FEW = "faster", "slower", "within noise", "too few measurements"
CLAIM_RULE = (
    f'Verdicts follow the claim rule: with n >= {MIN_PAIRINGS} paired ratios, "{FASTER}" if '
    f'every ratio > 1, "{SLOWER}" if every ratio < 1, else "{WITHIN_NOISE}"; with n < '
    f'{MIN_PAIRINGS}, "{TOO_FEW}" and no direction.'
)


def measurements(run: Run) -> list[float]:
    """The run's throughput measurements (samples/s), in epoch order.

    A measurement is one whole epoch that ran in one segment (``epoch_timings``:
    samples / wall_s). The first timed epoch is a warm-up (process and worker start-up,
    allocator, caches) and is dropped, so a run that timed ``k >= 2`` epochs gives
    ``k - 1`` measurements. A run that timed fewer (an older result without
    ``epoch_timings``, a one-epoch run, a run resumed mid-epoch) gives one: its own
    ``throughput_samples_per_s`` over the whole loop.

    Example:
        >>> run = Run("r", {}, {"throughput_samples_per_s": 3.0, "epoch_timings": [
        ...     {"epoch": 0, "wall_s": 4.0, "samples": 8, "steps": 2},
        ...     {"epoch": 1, "wall_s": 2.0, "samples": 8, "steps": 2}]})
        >>> measurements(run)
        [4.0]
    """
    timings = run.result.get("epoch_timings") or []
    if len(timings) < 2:
        return [run.throughput]
    for t in timings:
        if t["wall_s"] <= 0:
            raise ValueError(
                f"{run.name}: epoch {t['epoch']} has wall_s {t['wall_s']}; a timed epoch "
                "takes time: rerun the cell (its result file is not a real run's)"
            )
    return [t["samples"] / t["wall_s"] for t in timings[1:]]


def epoch_seconds(run: Run) -> list[float]:
    """The wall seconds behind :func:`measurements`, one per measurement: each timed
    epoch after the warm-up, else the run's whole training loop."""
    return per_measurement(run, "wall_s", float(run.result["train_wall_s"]))


def per_measurement(run: Run, key: str, whole_run: float) -> list[float]:
    """Figure ``key`` of each timed epoch after the warm-up (the epochs behind
    :func:`measurements`), or ``[whole_run]`` when the run timed fewer than 2 epochs
    or an epoch lacks ``key`` (an older result).

    Example:
        >>> run = Run("r", {}, {"epoch_timings": [
        ...     {"epoch": 0, "wall_s": 4.0, "samples": 8, "steps": 2, "data_wait_s": 1.0},
        ...     {"epoch": 1, "wall_s": 2.0, "samples": 8, "steps": 2, "data_wait_s": 0.5}]})
        >>> per_measurement(run, "data_wait_s", 1.5)
        [0.5]
    """
    timings = run.result.get("epoch_timings") or []
    if len(timings) < 2 or any(key not in t for t in timings):
        return [whole_run]
    return [float(t[key]) for t in timings[1:]]


def build_seconds(run: Run) -> list[float]:
    """Every timed pass of the run's length-cache build (one for a cache built once or
    an older result); ``[]`` for a run without a cache."""
    cache = run.result.get("length_cache")
    if not cache:
        return []
    return [float(t) for t in cache.get("build_timings") or [cache["build_seconds"]]]


def paired_ratios(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """``values[k] / reference[k]`` for each position both have (epoch k with epoch k).

    Example:
        >>> paired_ratios([4.0, 6.0, 5.0], [2.0, 3.0])
        [2.0, 2.0]
    """
    if any(r <= 0 for r in reference):
        raise ValueError(f"reference measurements must be > 0, got {list(reference)}")
    return [v / r for v, r in zip(values, reference, strict=False)]


def pairings(
    runs: Iterable[Run],
    ref_of: Callable[[Run], Run | None],
    measure: Callable[[Run], list[float]] = measurements,
) -> list[float]:
    """Every pairing of ``runs`` (seeds of one cell) with their references: each run's
    ``measure`` paired by position with that of ``ref_of(run)`` (same seed); a run
    without a reference adds none."""
    out: list[float] = []
    for run in runs:
        ref = ref_of(run)
        if ref is not None:
            out += paired_ratios(measure(run), measure(ref))
    return out


def pooled(runs: Iterable[Run]) -> list[float]:
    """The measurements of all ``runs`` (the seeds of one cell are repeats)."""
    return [m for run in runs for m in measurements(run)]


@dataclass(frozen=True)
class Spread:
    """Median, min, max and count of a set of measurements (or of paired ratios).

    Example:
        >>> Spread.of([2.24, 1.98, 2.10]).format(2, "x")
        '2.10x [1.98-2.24] n=3'
        >>> Spread.of([2.1]).format(2, "x")
        '2.10x (n=1)'
    """

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = [float(v) for v in values]
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def format(self, digits: int = 2, suffix: str = "") -> str:
        """The one cell format of every timing and ratio in the tables."""
        if self.n == 0:
            return "–"
        median = f"{self.median:.{digits}f}{suffix}"
        if self.n == 1:
            return f"{median} (n=1)"
        return f"{median} [{self.low:.{digits}f}-{self.high:.{digits}f}] n={self.n}"

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-ready (None where there is no measurement)."""
        if self.n == 0:
            return {"median": None, "low": None, "high": None, "n": 0}
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n}


def verdict(ratios: Sequence[float]) -> str:
    """The claim rule: what a set of paired ratios (run / reference) lets a table say.

    With ``n >= 3`` ratios: ``"faster"`` when every ratio is > 1, ``"slower"`` when
    every ratio is < 1, otherwise ``"within noise"``. With fewer: ``"too few
    measurements (n=K)"``, never a direction.

    Why: the two sides of a pairing were measured alike (same seed, same epoch
    position), so a real difference shows in every pairing while the machine's drift
    does not. It is a sign test: with no difference, n ratios fall on one side with
    probability 2 * 0.5**n (0.25 for n = 3, 0.06 for n = 5), so 3 is the floor below
    which nothing is claimed; more repeats sharpen the verdict, the rule stays.

    Example:
        >>> verdict([1.2, 1.1, 1.3]), verdict([1.2, 0.9, 1.3]), verdict([1.2, 1.1])
        ('faster', 'within noise', 'too few measurements (n=2)')
    """
    if len(ratios) < MIN_PAIRINGS:
        return f"{TOO_FEW} (n={len(ratios)})"
    if all(r > 1 for r in ratios):
        return FASTER
    if all(r < 1 for r in ratios):
        return SLOWER
    return WITHIN_NOISE


def claim(ratios: Sequence[float]) -> dict[str, Any]:
    """The JSON of a comparison: the ratios' median, low, high, n and the verdict."""
    return {**Spread.of(ratios).to_dict(), "verdict": verdict(ratios)}


@dataclass(frozen=True)
class Comparison:
    """The paired ratios of a cell's runs against their references, as a table shows them.

    The reference's own row (every run its own reference) reads ``reference``.

    Example:
        >>> c = Comparison((1.1, 1.2, 1.05))
        >>> c.cell(), c.verdict
        ('1.10x [1.05-1.20] n=3', 'faster')
    """

    ratios: tuple[float, ...]
    is_reference: bool = False

    def cell(self) -> str:
        return "reference" if self.is_reference else Spread.of(self.ratios).format(2, "x")

    @property
    def verdict(self) -> str:
        return "–" if self.is_reference else verdict(self.ratios)

    def to_dict(self) -> dict[str, Any] | None:
        return None if self.is_reference else claim(self.ratios)


def compare(
    runs: Sequence[Run],
    ref_of: Callable[[Run], Run | None],
    measure: Callable[[Run], list[float]] = measurements,
) -> Comparison:
    """``runs`` (the seeds of one cell) against ``ref_of`` each, paired by position."""
    if all(ref_of(run) is run for run in runs):
        return Comparison((), is_reference=True)
    return Comparison(tuple(pairings(runs, ref_of, measure)))


def sweep_row(
    got: Collected, runs: Sequence[Run], column: str, value: Any, versus: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cells every ablation sweep's row starts with (``runs``: one setting's seeds):
    dataset, setting, the swept ``column`` = ``value``, samples/s, the speedup vs Standard,
    the ratio against ODB at its default (column ``versus``) and that ratio's verdict;
    and the matching table data. A table adds its own cells to both."""
    first = runs[0]
    samples = Spread.of(pooled(runs))
    up = compare(runs, got.reference)
    vs_default = compare(runs, lambda r: got.reference(r, "odb"))
    row = {
        "Dataset": DATASET_LABEL[first["dataset"]],
        "Setting": first.setting,
        column: value,
        "Samples/s": samples.format(),
        "Speedup vs Standard": up.cell(),
        versus: vs_default.cell(),
        "Verdict vs default": vs_default.verdict,
    }
    data = {
        "dataset": first["dataset"],
        "samples_per_s": samples.to_dict(),
        "speedup": up.to_dict(),
        "vs_default": vs_default.to_dict(),
    }
    return row, data


def fixed(values: Sequence[Any], digits: int = 0) -> str:
    """A machine-independent figure over a cell's seeds: the value when they agree, else
    mean ± std; ``–`` when absent."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    if len(set(present)) == 1:
        return f"{float(present[0]):.{digits}f}"
    return mean_std(present, digits)


def by_variant(runs: Iterable[Run]) -> list[list[Run]]:
    """``runs`` grouped into cells that differ only by seed (repeats), in first-seen order."""
    groups = group(
        runs,
        lambda r: json.dumps(
            {k: v for k, v in r.cell.items() if k not in ("seed", "result", "evals")},
            sort_keys=True,
        ),
    )
    return list(groups.values())


def padded_per_sample(run: Run) -> float | None:
    """Padded tokens per emitted sample (what a sample costs under the budget's model)."""
    padded, samples = run.result.get("padded_tokens"), run.result["emitted_samples"]
    return padded / samples if padded is not None and samples else None


def scale_note(grid: Mapping[str, Any]) -> str:
    if grid["scale"] == "paper":
        return ""
    return (
        f"_{grid['scale']} numbers: tiny model on proxy data, not the paper's GPU "
        "numbers; read directions, not magnitudes._"
    )
