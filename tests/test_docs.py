"""The docs site: `make docs`'s build passes with warnings as errors, and says what it must.

- ``sphinx-build -W --keep-going`` over ``docs/`` (a broken link, a missing anchor or a
  reference to an undocumented name fails), into a fresh folder;
- the reference has an entry for every public name: ``odb.__all__``, ``odb.kit``,
  ``odb.planning`` and every public ``odb.integrations`` module's ``__all__``;
- the workflow-targets page names exactly the rules Snakemake itself lists;
- the getting-started page's scripts run as printed;
- the README is a front door: at most 150 lines, the two set-up commands first, and its
  links (and the changelog's) lead to files that exist.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import odb_reference  # noqa: E402  (docs/_ext: the generator the build runs)

README_MAX_LINES = 150


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            str(DOCS),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"make docs fails:\n{proc.stdout}\n{proc.stderr}"
    return out / "html"


@pytest.mark.slow
@pytest.mark.time_budget(
    120,
    reason="a whole Sphinx build: imports every integration's "
    "framework for autodoc and renders every page (about 30 s idle)",
)
@pytest.mark.timeout(600)
def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "getting-started.html").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("modname", odb_reference.public_modules())
def test_every_public_name_has_a_reference_entry(site: Path, modname: str) -> None:
    module = importlib.import_module(modname)
    missing = [name for name in module.__all__ if not _entry(site, module, modname, name)]
    assert missing == [], f"{modname}: no reference entry for {missing}"


def _entry(site: Path, module: object, modname: str, name: str) -> bool:
    """The name's own page holds its entry; a re-exported name's is where it is defined."""
    home = getattr(getattr(module, name), "__module__", modname)
    for owner in (modname, home):
        page = site / "reference" / "generated" / f"{owner}.{name}.html"
        if page.is_file() and f'id="{owner}.{name}"' in page.read_text():
            return True
    return False


@pytest.mark.slow
def test_workflow_targets_are_the_rules_snakemake_lists() -> None:
    snakemake = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run(
        [str(snakemake), "--list-rules"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    listed = {line.strip() for line in proc.stdout.splitlines() if line.strip()}
    documented = {name for name, _, _ in odb_reference.workflow_rules()}
    assert documented == listed


def test_every_run_config_key_is_on_the_page() -> None:
    from experiments.train.config import TrainConfig

    page = odb_reference.config_page()
    hints = typing.get_type_hints(TrainConfig)
    for section in dataclasses.fields(TrainConfig):
        cls = hints[section.name]
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                assert f"`{section.name}.{f.name}`" in page
        else:
            assert f"`{section.name}`" in page


def _code_blocks(page: Path) -> dict[str, str]:
    """``{file name: code}`` for every fenced Python block that opens with ``# name.py``."""
    blocks = re.findall(r"```python\n# (\w+\.py)\n(.*?)```", page.read_text(), re.DOTALL)
    return {name: code for name, code in blocks}


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.mark.slow
@pytest.mark.time_budget(
    90,
    reason="runs the page's two scripts as a reader would: two "
    "interpreters, a collate process, two epochs (about 20 s idle)",
)
def test_getting_started_scripts_run_as_printed(tmp_path: Path) -> None:
    blocks = _code_blocks(DOCS / "getting-started.md")
    assert set(blocks) == {"train.py", "plan_it.py"}
    for name, code in blocks.items():
        (tmp_path / name).write_text(code)
    train = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert train.returncode == 0, train.stderr
    assert re.search(r"epoch 1: \d+ steps, padding efficiency 0\.\d\d", train.stdout)
    plan = subprocess.run(
        [sys.executable, "plan_it.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert plan.returncode == 0, plan.stderr
    assert "recommended at 8 rank(s)" in plan.stdout


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    first_block = re.search(r"```bash\n(.*?)```", "\n".join(lines), re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make reproduce", "make test"]


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_lead_to_files(name: str) -> None:
    text = (ROOT / name).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, f"{name} links to no file of the repository"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == [], f"{name} links to missing files: {missing}"
