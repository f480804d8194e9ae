"""Packaging: the `odb` distribution is odb alone with ranges; the artifact's pins agree.

- pyproject.toml builds only the `odb` package and declares ranges (lower bounds the
  suite runs on), never an exact pin, so it installs into a user's environment as is;
- requirements/artifact.txt (what `make` installs) and environment.yml hold the same
  exact pins, which satisfy odb's ranges and equal the installed versions;
- `odb.__version__` is the installed distribution's version, pyproject.toml's;
- the built wheel holds only `odb/`, with its `py.typed` marker, and imports (its
  `__version__` from the wheel's metadata) and runs a W=1 epoch in a fresh venv that
  already has torch (slow).
"""

import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
META = PROJECT["project"]
EXTRAS = META["optional-dependencies"]
PINS_FILE = ROOT / "requirements" / "artifact.txt"
ARTIFACT_PACKAGES = ["baselines", "experiments", "eval", "paper", "bench"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin(requirement: str) -> tuple[str, str]:
    name, sep, ver = requirement.partition("==")
    assert sep and ver and not re.search(r"[<>=!~;\[ ]", name + ver), (
        f"{requirement!r} is not an exact `name==version` pin"
    )
    return _norm(name), ver


def _file_pins() -> dict[str, str]:
    lines = [line.strip() for line in PINS_FILE.read_text().splitlines()]
    return dict(_pin(line) for line in lines if line and not line.startswith("#"))


def _conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return dict(_pin(r) for r in pip if not r.startswith("-"))


def _ranges() -> list[str]:
    return list(META["dependencies"]) + [r for items in EXTRAS.values() for r in items]


def test_distribution_is_odb_alone() -> None:
    assert META["name"] == "odb"
    assert PROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["odb", "odb.*"]


def test_core_is_torch_and_numpy_with_lower_bounds() -> None:
    reqs = [Requirement(r) for r in META["dependencies"]]
    assert sorted(_norm(r.name) for r in reqs) == ["numpy", "torch"]
    for req in reqs:
        assert {s.operator for s in req.specifier} == {">="}, f"{req}: a lower bound only"


@pytest.mark.parametrize("requirement", _ranges())
def test_no_exact_pins_and_the_pinned_environment_satisfies_them(requirement: str) -> None:
    req = Requirement(requirement)
    assert not any(s.operator in ("==", "===", "<", "<=", "~=") for s in req.specifier), (
        f"{requirement}: odb declares lower bounds only (exact pins live in {PINS_FILE.name})"
    )
    pinned = _file_pins()[_norm(req.name)]
    assert req.specifier.contains(pinned), f"{requirement} excludes the tested {pinned}"


def test_environment_yml_pins_equal_the_pin_file() -> None:
    assert _conda_pins() == _file_pins()


def test_pin_file_starts_with_torch() -> None:
    assert next(iter(_file_pins())) == "torch"  # the Makefile installs it first, pinned


def test_environment_yml_python_is_311() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]


def test_installed_versions_match_pins() -> None:
    wrong = {}
    for name, pinned in _file_pins().items():
        try:
            installed = version(name).split("+")[0]  # torch's "+cpu" local label
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            wrong[name] = (pinned, installed)
    assert wrong == {}, f"pinned vs installed: {wrong}; run `make test` to reinstall"


def test_version_is_the_installed_distributions() -> None:
    import odb

    assert odb.__version__ == version("odb") == META["version"]


_FRESH_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import torch
    import odb, odb.integrations

    class Lengths:
        def __len__(self):
            return 40
        def __getitem__(self, i):
            ids = torch.arange(3 + i % 17)
            return {"input_ids": ids, "labels": ids.clone()}

    loader = odb.ODBLoader(Lengths(), token_budget=48, collate_mode="thread")
    ids = sorted(i for b in loader for i in odb.pop_step_info(b).sample_ids)
    print(json.dumps({
        "odb": odb.__file__,
        "version": odb.__version__,
        "ids": ids,
        "artifact": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None],
    }))
""")


@pytest.mark.slow
def test_wheel_holds_only_odb_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    # Built from a copy of what the wheel reads, so the checkout gets no build/ or egg-info.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "odb", src / "odb", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = (tmp_path / "dist").glob("odb-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in zf.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
        metadata = zf.read(meta).decode().splitlines()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"odb"}, sorted(tops)
    assert "odb/integrations/hf_trainer.py" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "odb/py.typed" in names  # PEP 561: users' type checkers read odb's annotations
    specs = [s.operator for r in requires for s in Requirement(r).specifier]
    assert requires and set(specs) == {">="}, requires

    # A fresh venv that already has torch (this environment's site-packages on its path,
    # without running their .pth hooks), odb installed from the wheel alone.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    ours = [p for p in sys.path if p.endswith("site-packages")]
    Path(site.stdout.strip(), "with_torch.pth").write_text("\n".join(ours) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    proc = subprocess.run(
        [str(python), "-I", "-c", _FRESH_SCRIPT, *ARTIFACT_PACKAGES],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert result["odb"].startswith(str(venv)), result["odb"]
    assert result["version"] == META["version"]
    assert result["ids"] == list(range(40))
    assert result["artifact"] == []  # the experiment packages stay in the checkout
