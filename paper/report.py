"""The report: every table and figure, the scale they were made at, and the paper beside.

Reads the tables' JSON and Markdown that the other ``paper`` scripts wrote (never the
raw results again, so each number has one producer) and writes one Markdown file. It
states the scale, the hardware and the commit the results were made at; at CPU-proxy
scale it says plainly that the numbers are not the paper's GPU numbers, compares
*directions* only and says which CPU figures carry to the GPU setting. A direction is
stated only by the claim rule (``paper.claims.verdict``): the summary counts the
settings per verdict and agrees with the paper only when every one is "faster". A table
with missing cells fails the report unless ``--allow-partial``; then the missing cells
are listed.

    python -m paper.report --grid results/paper/grid.json --paper-dir results/paper \\
        --out results/paper/REPORT.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.grid_cells import TABLES
from paper import heldout, published
from paper.claims import CLAIM_RULE, FASTER, SLOWER, TOO_FEW, WITHIN_NOISE, Spread
from paper.common import DATASET_LABEL, METHOD_LABEL, IncompleteGridError, num


def _load(paper_dir: Path, name: str) -> dict[str, Any]:
    path = paper_dir / "tables" / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run `python -m paper.{name}` (or snakemake table_{name}) first"
        )
    return json.loads(path.read_text())


def _results_meta(grid: dict[str, Any], root: Path) -> tuple[set[str], set[str]]:
    commits, hardware = set(), set()
    for cell in grid["cells"].values():
        path = root / cell["result"]
        if path.exists():
            result = json.loads(path.read_text())
            commits.add(result.get("git_commit", "unknown"))
            hw = result.get("hardware", {})
            gpu = hw.get("gpu") or "no GPU"
            hardware.add(
                f"{hw.get('cpu_count', '?')} CPUs, {gpu}, W={result['world_size']}, "
                f"{result['nodes']} node(s)"
            )
    return commits, hardware


def _speedup_text(claim: dict[str, Any]) -> str:
    spread = Spread(**{k: claim[k] for k in ("median", "low", "high", "n")})
    return f"{spread.format(2, 'x')}, {claim['verdict']}"


def _throughput_direction(tables: dict[str, dict]) -> list[str]:
    """ODB vs Standard per setting, counted by verdict; the direction agrees only when
    every setting is "faster" by the claim rule."""
    data = [
        d
        for d in tables["throughput"]["data"]
        if d["method"] == "odb" and d["speedup"] and d["speedup"]["n"]
    ]
    if not data:
        return ["- Throughput: no ODB/Standard pair in the grid."]
    verdicts = [d["speedup"]["verdict"] for d in data]
    n, faster, slower = len(verdicts), verdicts.count(FASTER), verdicts.count(SLOWER)
    few = sum(v.startswith(TOO_FEW) for v in verdicts)
    if faster == n:
        direction = "Direction agrees: faster in every setting."
    elif slower:
        direction = f"Direction differs: ODB is slower in {slower} setting(s)."
    else:
        direction = f'Direction not shown: {n - faster} of {n} setting(s) are not "faster".'
    medians = [d["speedup"]["median"] for d in data]
    lines = [
        f"- **Throughput** (ODB vs Standard, by the claim rule): faster in {faster}, "
        f"slower in {slower}, within noise in {verdicts.count(WITHIN_NOISE)}, too few "
        f"measurements in {few} of {n} setting(s); medians {num(min(medians))}x - "
        f"{num(max(medians))}x. Paper: "
        + "; ".join(f"{k} {lo}x - {hi}x" for k, (lo, hi) in published.SPEEDUP_RANGES.items())
        + f". {direction}"
    ]
    for dataset, setting, std, odb, up in published.THROUGHPUT:
        ours = [
            f"{d['model']} {d['mode']} {d['nodes']}N {_speedup_text(d['speedup'])}"
            for d in data
            if d["dataset"] == dataset
        ]
        lines.append(
            f"  - {DATASET_LABEL[dataset]}: paper {up}x ({setting}: Standard {std} "
            f"vs ODB {odb} samples/s); ours {'; '.join(ours) or 'not run'}."
        )
    return lines


def _method_section() -> list[str]:
    """What a measurement is and the rule every verdict follows."""
    return [
        "**How claims are made.** A measurement is one whole training epoch (samples / "
        "wall time); the first epoch of each run is a warm-up and is dropped, and a run "
        "that timed fewer than 2 epochs gives one whole-run figure; the seeds of a cell "
        "are further repeats. A ratio (a speedup) is computed per pairing, a run's epoch "
        "k against its reference's epoch k with the same seed, and shown as median "
        f"[min-max] n=pairings. {CLAIM_RULE}",
        "",
    ]


def _carry_section(grid: dict[str, Any]) -> list[str]:
    """At a scale other than the paper's: which CPU figures carry to the GPU setting."""
    if grid["scale"] == "paper":
        return []
    return [
        "**What carries to the paper's GPU setting.** The machine-independent figures next "
        "to each timing (steps, padding efficiency, padded tokens per sample, IDLE steps, "
        "budget fill) depend only on the lengths and the grouping, so they carry to the "
        "GPU setting as they are. The CPU samples/s and speedups do not: on two CPU cores "
        "a step costs about its padded tokens whatever its batch size, while on a GPU a "
        "step's time is nearly flat in the batch size until the device saturates, so "
        'fewer, fuller steps pay there and not here (`docs/benchmarks.md`, "End-to-end '
        'training throughput per method").',
        "",
    ]


def _quality_direction(tables: dict[str, dict]) -> list[str]:
    data = tables["quality"]["data"]
    by_setting: dict[tuple, dict[str, float]] = {}
    for d in data:
        key = (d["dataset"], d["model"], d["mode"], d["nodes"])
        by_setting.setdefault(key, {})[d["method"]] = d["val_loss"]
    inside, total, lines = 0, 0, []
    for key, losses in sorted(by_setting.items()):
        if "odb" not in losses or len(losses) < 2:
            continue
        others = [v for m, v in losses.items() if m != "odb" and not math.isnan(v)]
        lo, hi = min(others), max(others)
        odb = losses["odb"]
        # the band: the spread of the other methods' validation losses in this setting
        ok = lo - 1e-9 <= odb <= hi + 1e-9 or (
            "standard" in losses and abs(odb - losses["standard"]) <= 0.01 * losses["standard"]
        )
        inside += ok
        total += 1
        lines.append(
            f"  - {DATASET_LABEL[key[0]]} {key[1]} {key[2]} {key[3]}N: ODB "
            f"{num(odb, 3)}, others {num(lo, 3)} - {num(hi, 3)} "
            f"({'comparable' if ok else 'not comparable'})"
        )
    head = (
        f"- **Quality** (validation loss): ODB inside the band of the other methods (or "
        f"within 1% of Standard) in {inside} of {total} setting(s). Paper: "
        '"Standard-comparable band" (e.g. 8B UltraChat MMLU: ODB 74.75, Packing 75.18, '
        "GMT 75.14)."
    )
    return [head, *lines]


def _check_complete(tables: dict[str, dict], allow_partial: bool) -> dict[str, list]:
    """The missing cells of each table that has some (``{table: [cell, ...]}``).

    Raises:
        IncompleteGridError: some are missing and ``allow_partial`` is False.
    """
    missing = {name: t["missing"] for name, t in tables.items() if t["missing"]}
    if missing and not allow_partial:
        raise IncompleteGridError(
            "the grid is incomplete: "
            + "; ".join(f"{k}: {len(v)} missing" for k, v in missing.items())
            + ". Run the missing cells or pass --allow-partial (config allow_partial: true)"
        )
    return missing


def _header(grid: dict[str, Any], root: Path) -> list[str]:
    """The title, the scale statement (at CPU-proxy scale: directions only), the hardware,
    the commits the results were made at and the cell count."""
    commits, hardware = _results_meta(grid, root)
    out = ["# ODB reproduction report", ""]
    if grid["scale"] != "paper":
        what = grid.get("scale_note") or (
            "Tiny Qwen3-VL (~1M parameters, random init) on proxy datasets with the paper's "
            "length statistics, W=2 ranks on CPU."
        )
        out += [
            f"> **Scale: {grid['scale']}.** {what} "
            "These numbers are **not** the paper's GPU numbers: compare directions, "
            "never magnitudes. Benchmark scores of this model are pipeline checks.",
            "",
        ]
    else:
        out += [f"> **Scale: {grid['scale']}** (Qwen3-VL 2B/8B on GPUs).", ""]
    return out + [
        f"- Hardware (config): {grid['hardware']}",
        f"- Hardware (measured by the runs): {'; '.join(sorted(hardware)) or 'n/a'}",
        f"- Commit(s) the results were made at: {', '.join(sorted(commits)) or 'n/a'}",
        f"- Cells: {len(grid['cells'])}",
        "",
    ]


def failed_cells(missing: dict[str, list], root: Path) -> dict[str, str]:
    """The missing cells whose training job ran and ended without a result: ``{cell: its
    log}`` (``logs/train/<cell>.log`` under ``root`` exists and
    ``results/train/<cell>/result.json`` does not). A cell never run has no log; a cell
    that trained but lacks an evaluation is missing from the quality table only."""
    cells = sorted({c for names in missing.values() for c in names})
    return {c: f"logs/train/{c}.log" for c in cells
            if (root / "logs/train" / f"{c}.log").exists()
            and not (root / "results/train" / c / "result.json").exists()}


def _missing_section(missing: dict[str, list], root: Path) -> list[str]:
    """The failed cells with their logs, then every missing cell of a partial grid
    (nothing when the grid is complete)."""
    if not missing:
        return []
    out = []
    failed = failed_cells(missing, root)
    if failed:
        out += ["## Failed cells", "", "Their training job ran and left no result; rerun one "
                "with `snakemake --profile slurm results/train/<cell>/result.json` after "
                "reading its log (docs/workflow.md, \"Failed cells\").", ""]
        out += [f"- `{cell}`: `{log}`" for cell, log in failed.items()] + [""]
    out += ["## Missing cells (partial grid)", ""]
    out += [f"- {k}: " + ", ".join(f"`{m}`" for m in v) for k, v in missing.items()]
    return [*out, ""]


def _claims_section(tables: dict[str, dict], grid: dict[str, Any]) -> list[str]:
    """Our directions against the paper's claims, then the paper's published numbers."""
    throughput = pd.DataFrame(
        [
            {
                "Dataset": DATASET_LABEL[d],
                "Setting": s,
                "Standard samples/s": a,
                "ODB samples/s": b,
                "Speedup": f"{c}x",
            }
            for d, s, a, b, c in published.THROUGHPUT
        ]
    )
    quality = pd.DataFrame(
        [
            {"Dataset": DATASET_LABEL[d], "Setting": s, "Benchmark": b, "ODB": o, "Others": r}
            for d, s, b, o, r in published.QUALITY
        ]
    )
    return [
        "## Our results against the paper's claims",
        "",
        *_method_section(),
        *_throughput_direction(tables),
        *_quality_direction(tables),
        "",
        *_carry_section(grid),
        "Published numbers (the paper, 8x H20 nodes):",
        "",
        throughput.to_markdown(index=False),
        "",
        quality.to_markdown(index=False),
        "",
    ]


def _tables_section(paper_dir: Path) -> list[str]:
    """Every table's Markdown in ``TABLES``, its figure when there is one, and its maker."""
    out = ["## Tables and figures", ""]
    for name in TABLES:
        out.append((paper_dir / "tables" / f"{name}.md").read_text().rstrip())
        out.append("")
        figure = paper_dir / "figures" / f"{name}.png"
        if figure.exists():
            out += [f"![{name}](figures/{name}.png)", ""]
        out += [f"LaTeX: `tables/{name}.tex`. Made by `python -m paper.{name}`.", ""]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, required=True)
    parser.add_argument("--paper-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--allow-partial", action="store_true")
    args = parser.parse_args(argv)
    grid = json.loads(args.grid.read_text())
    tables = {name: _load(args.paper_dir, name) for name in TABLES}
    missing = _check_complete(tables, args.allow_partial)
    out = [
        *_header(grid, args.root),
        *_missing_section(missing, args.root),
        *_claims_section(tables, grid),
        *heldout.section(args.root),
        *_tables_section(args.paper_dir),
        "---",
        f"Methods: {', '.join(METHOD_LABEL.values())}. Every number above comes from one "
        "`paper/` script reading result JSON; none is edited by hand.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
