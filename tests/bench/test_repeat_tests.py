"""``bench.repeat_tests`` counts failures, hangs and each test's outcome over real,
repeated pytest runs; ``bench.repeat_table`` tabulates them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from bench._repeat_run import Load
from bench.repeat_table import main as table_main
from bench.repeat_tests import checkout_commit, main, marked_modules, next_round, same_code

FLAKY = """
import os, pathlib, pytest

def test_always():
    assert True

def test_second_run_fails():
    marker = pathlib.Path(os.environ["REPEAT_MARKER"])
    first = not marker.exists()
    marker.touch()
    assert first

@pytest.mark.skip(reason="never runs")
def test_skipped():
    pass
"""

HANGS = """
import os, pathlib, time

def test_hangs_the_second_time():
    marker = pathlib.Path(os.environ["REPEAT_MARKER"])
    first = not marker.exists()
    marker.touch()
    if not first:
        time.sleep(600)
"""


# Real pytest runs, one interpreter each (~3 s idle); the quick tier keeps the next test.
@pytest.mark.slow
def test_counts_outcomes_per_test_over_repeats(tmp_path: Path, monkeypatch) -> None:
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(FLAKY)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    out = tmp_path / "result.json"
    code = main([str(test_file), "--times", "3", "--out", str(out)])
    (result,) = json.loads(out.read_text())["selections"]
    assert code == 1 and result["repeats_run"] == 3 and not result["all_passed_every_time"]
    assert (result["failures"], result["hangs"]) == (2, 0)
    by_name = {k.rsplit("::", 1)[1]: v for k, v in result["per_test"].items()}
    assert by_name["test_always"]["passed"] == 3
    assert by_name["test_second_run_fails"] == dict(passed=1, failed=2, error=0, skipped=0)
    assert by_name["test_skipped"]["skipped"] == 3


def test_stop_on_failure_ends_at_first_red_run(tmp_path: Path, monkeypatch) -> None:
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(FLAKY)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    out = tmp_path / "result.json"
    assert main([str(test_file), "--times", "5", "--stop-on-failure", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["selections"][0]["repeats_run"] == 2


def _commit_all(repo: Path, message: str) -> str:
    """Commit everything in ``repo`` (a scratch repository); its commit id."""
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", message], check=True, capture_output=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _scratch_repo(tmp_path: Path, monkeypatch) -> Path:
    """A git repository holding the FLAKY test file, as the working directory."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "test_sample.py").write_text(FLAKY)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    return repo


def test_same_code_allows_docs_changes_only(tmp_path: Path, monkeypatch) -> None:
    repo = _scratch_repo(tmp_path, monkeypatch)
    first = _commit_all(repo, "code")
    (repo / "docs").mkdir()
    (repo / "docs" / "testing.md").write_text("the table\n")
    (repo / "CHANGELOG.md").write_text("history\n")
    docs_only = _commit_all(repo, "docs")
    assert checkout_commit() == docs_only and same_code(first)
    (repo / "test_sample.py").write_text(FLAKY + "# changed\n")
    assert checkout_commit() == docs_only + "+dirty" and not same_code(first)
    _commit_all(repo, "code again")
    assert not same_code(first)
    assert not same_code(docs_only + "+dirty")  # repeats of uncommitted code
    assert not same_code("0" * 40)  # not a commit of this repository


def test_rounds_repeat_the_least_repeated_first_so_a_resumed_campaign_evens_out() -> None:
    runs = (4, 6, 5, 4)
    tallies = [SimpleNamespace(at=at, runs=n, red=n == 5) for at, n in enumerate(runs)]
    rounds = []
    while round_ := next_round(tallies, 6, stop_on_failure=False):  # type: ignore[arg-type]
        rounds.append([t.at for t in round_])
        for tally in round_:
            tally.runs += 1
    assert rounds == [[0, 3], [0, 2, 3]]
    assert [t.runs for t in tallies] == [6, 6, 6, 6]
    tallies[2].runs = 5
    assert next_round(tallies, 6, stop_on_failure=True) == []  # the red one stops there


@pytest.mark.slow
def test_resume_goes_on_from_the_saved_repeats_of_the_same_code(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    repo = _scratch_repo(tmp_path, monkeypatch)
    first = _commit_all(repo, "code")
    out_dir = tmp_path / "repeats"
    argv = ["test_sample.py", "--out-dir", str(out_dir)]
    assert main([*argv, "--times", "1"]) == 0
    (saved,) = out_dir.glob("*.json")
    assert json.loads(saved.read_text())["commit"] == first  # saved after the repeat
    (repo / "docs").mkdir()
    (repo / "docs" / "testing.md").write_text("the first repeat's table\n")
    _commit_all(repo, "docs")
    assert main([*argv, "--times", "2", "--resume"]) == 1
    resumed = json.loads(saved.read_text())
    assert (resumed["repeats_run"], resumed["failures"], resumed["commit"]) == (2, 1, first)
    by_name = {k.rsplit("::", 1)[1]: v for k, v in resumed["per_test"].items()}
    assert by_name["test_second_run_fails"] == dict(passed=1, failed=1, error=0, skipped=0)
    (repo / "test_sample.py").write_text(FLAKY + "# changed\n")
    _commit_all(repo, "code again")
    with pytest.raises(SystemExit, match="a campaign counts one code"):
        main([*argv, "--times", "3", "--resume"])
    with pytest.raises(SystemExit):
        main(["test_sample.py", "--resume"])
    assert "--resume goes on from the repeats saved in --out-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_a_repeat_past_its_limit_is_a_hang_with_its_stacks_kept(
    tmp_path: Path, monkeypatch
) -> None:
    test_file = tmp_path / "test_hang.py"
    test_file.write_text(HANGS)
    monkeypatch.setenv("REPEAT_MARKER", str(tmp_path / "marker"))
    out_dir = tmp_path / "repeats"
    argv = [str(test_file), "--times", "2", "--timeout-s", "25", "--load", "1"]
    assert main([*argv, "--out-dir", str(out_dir)]) == 1
    (result_file,) = out_dir.glob("*.json")
    result = json.loads(result_file.read_text())
    assert (result["repeats_run"], result["failures"], result["hangs"], result["load"]) == (
        2, 0, 1, 1,
    )  # fmt: skip
    (log,) = result["logs"]
    text = Path(log).read_text()
    assert "=== HANG" in text and "test_hangs_the_second_time" in text  # pytest's stack dump
    assert "wchan" in text
    assert "test_hangs_the_second_time (" in text.split("=== each process's stacks (py-spy)")[1]
    table_main([str(result_file)])


def test_the_table_has_a_row_per_selection(tmp_path: Path, capsys) -> None:
    doc = {
        "selections": [
            dict(selection=["tests/a.py"], commit="0123456789ab", repeats_run=20, failures=1,
                 hangs=0, load=2, wall_s_per_repeat=[10.2, 31.0],
                 load_average_1min_per_repeat=[4.0, 2.5]),
            dict(selection=["tests/b.py"], repeats_run=5, failures=0, hangs=1, load=0,
                 wall_s_per_repeat=[3.0]),
        ]
    }  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    table_main([str(path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| 0123456 | `tests/a.py` | 20 | 1 | 0 | 2 busy, load avg 2.5-4.0 | 10-31 |"
    assert lines[3] == "| - | `tests/b.py` | 5 | 0 | 1 | 0 busy | 3-3 |"


def test_the_summary_counts_rounds_against_every_module(tmp_path: Path, capsys) -> None:
    files = []
    for name, runs, fails in (("a", 3, 0), ("b", 2, 1)):
        doc = dict(selection=[f"tests/{name}.py"], repeats_run=runs, failures=fails, hangs=0,
                   load=0, wall_s_per_repeat=[100.0] * runs)  # fmt: skip
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    table_main(["--rounds-of", "2", *map(str, files)])
    assert capsys.readouterr().out.splitlines()[0] == (
        "2 complete rounds of 2 modules (5 repeats of 2 modules), 500 s of repeats, "
        "1 failure, 0 hangs"
    )
    table_main(["--rounds-of", "3", *map(str, files)])  # a third module has not run yet
    assert capsys.readouterr().out.startswith("0 complete rounds of 3 modules (5 repeats")
    with pytest.raises(SystemExit):
        table_main(["--rounds-of", "0", str(files[0])])
    assert "--rounds-of must be at least 1, got 0" in capsys.readouterr().err


def test_load_processes_run_inside_and_are_stopped_after() -> None:
    with Load(2) as load:
        pids = load.pids()
        assert len(pids) == 2
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


@pytest.mark.slow
def test_the_dist_modules_are_the_marked_ones() -> None:
    modules = marked_modules("dist or slurm")
    assert "tests/odb/test_faults.py" in modules and "tests/odb/test_native_threads.py" in modules
    assert "tests/odb/core/test_alignment.py" not in modules  # no process started there
