"""``python -m odb.planning``: a dataset object, or a factory's dataset, planned from a shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import odb
from harness.scenarios import LengthDataset
from odb.planning.cli import main
from tests.odb.planning.test_plan import SCHEMA, spread_lengths

ROOT = Path(__file__).resolve().parents[3]


def spread_dataset() -> LengthDataset:
    """A factory the command is given."""
    return LengthDataset(spread_lengths(300, 5))


SPREAD_SET = spread_dataset()  # a dataset object the command is given
NOT_A_DATASET = 3


def test_the_command_prints_the_table_and_writes_json_and_plot(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "odb.planning", "--dataset",
         "tests.odb.planning.test_cli:SPREAD_SET", "--world-sizes", "1", "2",
         "--budgets", "4096", "8192", "--json", str(tmp_path / "plan.json"),
         "--plot", str(tmp_path / "plan.png")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "speed-up" in out.stdout and "recommended at 2 rank(s)" in out.stdout
    assert "odb.plan: measured 300/300 samples" in out.stderr
    report = json.loads((tmp_path / "plan.json").read_text())
    jsonschema.validate(report, SCHEMA)
    assert len(report["rows"]) == 4 and (tmp_path / "plan.png").stat().st_size > 10_000


@pytest.mark.parametrize("name", ["SPREAD_SET", "spread_dataset"])
def test_the_command_and_the_function_agree(name: str) -> None:
    report = main(["--dataset", f"tests.odb.planning.test_cli:{name}",
                   "--world-sizes", "4", "--budgets", "8192", "--step-cost", "0", "1"])  # fmt: skip
    direct = odb.plan(spread_dataset(), world_sizes=[4], budgets=[8192], progress=False,
                      step_cost=odb.planning.StepCost(0, 1))  # fmt: skip
    assert report["rows"] == direct.rows


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nocolon", "give module:name"),
        ("no_such_module_x:f", "cannot import"),
        ("tests.odb.planning.test_cli:missing", "has no 'missing'"),
        ("tests.odb.planning.test_cli:NOT_A_DATASET", r"\(type int\) is neither a map-style"),
    ],
)
def test_a_bad_dataset_says_what_to_change(spec: str, words: str) -> None:
    with pytest.raises(SystemExit, match=words):
        main(["--dataset", spec])


def test_the_help_says_a_dataset_or_a_function(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--dataset MODULE:NAME" in text
    assert "a dataset object, or a function that returns one" in text
