"""pyproject.toml, environment.yml and the installed environment agree on every pin."""

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
SELF = re.compile(r"^odb-artifact\[(?P<extras>[^\]]+)\]$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin(requirement: str) -> tuple[str, str]:
    name, sep, ver = requirement.partition("==")
    assert sep and ver and not re.search(r"[<>=!~;\[ ]", name + ver), (
        f"{requirement!r} is not an exact `name==version` pin"
    )
    return _norm(name), ver


def _pyproject_pins() -> dict[str, str]:
    reqs = list(PROJECT["dependencies"])
    for extra, items in EXTRAS.items():
        if extra != "all":
            reqs += items
    return dict(_pin(r) for r in reqs)


def _conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return dict(_pin(r) for r in pip if not r.startswith("-e"))


def test_core_is_torch_and_numpy_only():
    assert sorted(_pin(r)[0] for r in PROJECT["dependencies"]) == ["numpy", "torch"]


def test_all_extra_is_every_other_extra():
    (only,) = EXTRAS["all"]
    named = {e.strip() for e in SELF.match(only).group("extras").split(",")}
    assert named == set(EXTRAS) - {"all"}


def test_environment_yml_pins_equal_pyproject():
    assert _conda_pins() == _pyproject_pins()


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) - {"all"}))
def test_every_extra_package_is_in_environment_yml(extra):
    conda = _conda_pins()
    missing = [r for r in EXTRAS[extra] if _pin(r)[0] not in conda]
    assert missing == [], f"[{extra}] packages missing from environment.yml: {missing}"


def test_environment_yml_python_is_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]


def test_installed_versions_match_pins():
    wrong = {}
    for name, pinned in _pyproject_pins().items():
        try:
            installed = version(name).split("+")[0]  # torch's "+cpu" local label
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            wrong[name] = (pinned, installed)
    assert wrong == {}, f"pinned vs installed: {wrong}; run `make test` to reinstall"
