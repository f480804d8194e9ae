"""Issue 15's shape limits: small odb modules and functions; baselines on odb's public API."""

from __future__ import annotations

import ast
from pathlib import Path

import odb

ROOT = Path(__file__).parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_no_odb_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules("odb")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"odb modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_odb_function_is_over_60_lines() -> None:
    long = {}
    for path in _modules("odb"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"odb functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_baselines_use_only_odbs_public_api() -> None:
    """``import odb`` and names in ``odb.__all__``; never an odb submodule."""
    public = set(odb.__all__)
    found = []
    for path in _modules("baselines"):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("odb."):
                found.append(f"{where} from {node.module} import ...")
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("odb.")]
                found += [f"{where} import {name}" for name in names]
            elif isinstance(node, ast.ImportFrom) and node.module == "odb":
                found += [f"{where} odb.{a.name}" for a in node.names if a.name not in public]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "odb"
                and node.attr not in public
            ):
                found.append(f"{where} odb.{node.attr}")
    assert not found, f"baselines reach past odb's public API: {found}"
