"""Shape limits: small modules and short functions in all non-test code (issues 15, 34, 59);
baselines on odb and odb.kit."""

from __future__ import annotations

import ast
from pathlib import Path

import odb
import odb.kit

ROOT = Path(__file__).parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


# All non-test code: the library, the baselines, the recipes and the scripts around them.
CODE_PACKAGES = ("odb", "baselines", "experiments", "eval", "paper", "examples", "bench", "harness")


# Not the repository's own code: the tests, build and workflow outputs, hidden folders
# (virtual environments, caches, .git).
NOT_CODE = ("tests", "build", "dist", "results", "logs")


def _non_test_modules() -> list[Path]:
    """Every Python file of the repository outside ``tests/``, whatever package it is in."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in NOT_CODE or any(p.startswith(".") or p.endswith(".egg-info") for p in parts):
            continue
        found.append(path)
    return found


def test_no_module_outside_tests_is_over_400_lines() -> None:
    """The size ``odb`` keeps holds for every module outside ``tests/`` (issue 59): a module
    that grows past it is split by what it does."""
    modules = _non_test_modules()
    assert {p.relative_to(ROOT).parts[0] for p in modules} >= set(CODE_PACKAGES)
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by what they do): {long}"


def test_no_function_is_over_60_lines() -> None:
    """Every function of non-test code, docstring included, fits in 60 lines."""
    long = {}
    for package in CODE_PACKAGES:
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _odb_names(node: ast.AST) -> list[str]:
    """The ``odb`` names a node reaches: ``odb.X``, ``odb.kit.X``, imported modules and names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "odb"]
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "odb":
        return [f"{node.module}.{a.name}" for a in node.names]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "odb" and node.attr != "kit":
            return [f"odb.{node.attr}"]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
        inner = node.value
        if isinstance(inner.value, ast.Name) and (inner.value.id, inner.attr) == ("odb", "kit"):
            return [f"odb.kit.{node.attr}"]
    return []


def test_baselines_use_only_odbs_public_api_and_the_kit() -> None:
    """``odb.X`` for X in ``odb.__all__``, ``odb.kit.X`` for X in ``odb.kit.__all__``.

    The import contracts (``pyproject.toml``, ``tests/test_import_contracts.py``) check
    which modules the baselines import; this checks the names they use from them.
    """
    public = {"odb", "odb.kit"}
    public |= {f"odb.{name}" for name in odb.__all__}
    public |= {f"odb.kit.{name}" for name in odb.kit.__all__}
    found = []
    for path in _modules("baselines"):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            found += [f"{where} {name}" for name in _odb_names(node) if name not in public]
    assert not found, f"baselines reach past odb's public API and odb.kit: {found}"
