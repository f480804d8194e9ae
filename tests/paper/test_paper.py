"""Every paper script on frozen fixture JSON: golden tables, figures drawn, no torch,
an incomplete grid refused unless partial tables are asked for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.grid import TABLES
from paper.common import IncompleteGridError

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
FIGURES = ("throughput", "budget", "depth", "leverage")


def _module(name: str):
    import importlib

    return importlib.import_module(f"paper.{name}")


def run_all(out: Path, root: Path = FIXTURES, partial: bool = False) -> None:
    extra = ["--allow-partial"] if partial else []
    for name in TABLES:
        _module(name).main(
            ["--grid", str(root / "grid.json"), "--out-dir", str(out), "--root", str(root), *extra]
        )
    _module("report").main(
        [
            "--grid",
            str(root / "grid.json"),
            "--paper-dir",
            str(out),
            "--out",
            str(out / "REPORT.md"),
            "--root",
            str(root),
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("paper")
    run_all(out)
    return out


@pytest.mark.parametrize("name", TABLES)
def test_table_matches_golden(made: Path, name: str) -> None:
    for ext in ("md", "tex", "json"):
        got = (made / "tables" / f"{name}.{ext}").read_text()
        want = (GOLDEN / "tables" / f"{name}.{ext}").read_text()
        assert got == want, (
            f"{name}.{ext} differs from tests/paper/golden (regenerate with "
            "python -m tests.paper.make_fixtures only if the change is meant)"
        )


@pytest.mark.parametrize("name", FIGURES)
def test_figure_is_drawn(made: Path, name: str) -> None:
    png = made / "figures" / f"{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_report_matches_golden_and_states_the_scale(made: Path) -> None:
    text = (made / "REPORT.md").read_text()
    assert text == (GOLDEN / "REPORT.md").read_text()
    assert "**Scale: CPU-proxy.**" in text and "**not** the paper's GPU numbers" in text
    assert "1.58x - 2.51x" in text  # the paper's claim set beside ours
    for name in FIGURES:
        assert f"figures/{name}.png" in text


def test_directions_are_computed_from_the_tables(made: Path) -> None:
    data = json.loads((made / "tables" / "throughput.json").read_text())["data"]
    odb = {(d["dataset"], d["mode"]): d["speedup"] for d in data if d["method"] == "odb"}
    # fixture: ODB is 2.1x Standard's base speed (+ <= 10% jitter on each)
    assert all(1.8 < up < 2.4 for up in odb.values()), odb
    assert "faster in 5 of 5" in (made / "REPORT.md").read_text()


def _partial_root(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES, root)
    gone = "ultrachat.odb.tiny-full-n1-s0"
    shutil.rmtree(root / "results" / "train" / gone)
    return root, gone


def test_incomplete_grid_fails_loudly(tmp_path: Path) -> None:
    root, gone = _partial_root(tmp_path)
    with pytest.raises(IncompleteGridError, match=gone):
        _module("throughput").main(
            [
                "--grid",
                str(root / "grid.json"),
                "--out-dir",
                str(tmp_path / "out"),
                "--root",
                str(root),
            ]
        )


def test_allow_partial_lists_the_missing_cells(tmp_path: Path) -> None:
    root, gone = _partial_root(tmp_path)
    out = tmp_path / "out"
    run_all(out, root, partial=True)
    assert f"`{gone}`" in (out / "tables" / "throughput.md").read_text()
    report = (out / "REPORT.md").read_text()
    assert "## Missing cells (partial grid)" in report and gone in report
    with pytest.raises(IncompleteGridError, match="incomplete"):
        _module("report").main(
            [
                "--grid",
                str(root / "grid.json"),
                "--paper-dir",
                str(out),
                "--out",
                str(out / "R.md"),
                "--root",
                str(root),
            ]
        )


def test_paper_scripts_import_no_torch() -> None:
    code = (
        "import sys; import paper.report, paper.throughput, paper.quality, paper.cache, "
        "paper.budget, paper.depth, paper.leverage, paper.policy, paper.join, "
        "paper.staleness; assert 'torch' not in sys.modules, 'paper imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=HERE.parents[1])


def test_report_states_the_configs_own_scale_note(made: Path, tmp_path: Path) -> None:
    """A scale other than the CPU proxies (the paper-path rehearsal) says what it is."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES, root)
    grid = json.loads((root / "grid.json").read_text())
    grid.update(scale="paper-rehearsal", scale_note="A rehearsal on a local Slurm cluster.")
    (root / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "paper"
    out.mkdir()
    shutil.copytree(made / "tables", out / "tables")
    _module("report").main(["--grid", str(root / "grid.json"), "--paper-dir", str(out),
                            "--out", str(out / "REPORT.md"), "--root", str(root)])
    text = (out / "REPORT.md").read_text()
    assert "**Scale: paper-rehearsal.** A rehearsal on a local Slurm cluster." in text
    assert "proxy datasets" not in text.split("\n\n")[1]
