"""`odb` type-checks: mypy, as configured in pyproject.toml ([tool.mypy]), passes on all of
`odb/`, and `odb/core` is checked with every flag of `--strict`.

odb ships `py.typed`, so its annotations are what a user's type checker reads: an error
here is a wrong type in the API users see, or a bug (issue 59 found a window adapter that
would call a method the model lacks). A cold run (a fresh clone) reads torch's and
transformers' types and takes up to a minute or more on a busy machine; mypy's cache
(`.mypy_cache/`, ignored by git) makes a repeated run take seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYPY = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]

# The per-module flags `mypy --strict` turns on (mypy 2.4; `strict` itself is global only).
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}


def test_odb_core_is_checked_with_every_strict_flag() -> None:
    (core,) = [o for o in MYPY["overrides"] if "odb.core.*" in o["module"]]
    assert "odb.core" in core["module"]
    assert {flag for flag in STRICT_FLAGS if core.get(flag) is True} == STRICT_FLAGS
    assert MYPY["files"] == ["odb"]
    assert MYPY["warn_unused_ignores"] and MYPY["warn_redundant_casts"]


@pytest.mark.slow
@pytest.mark.time_budget(120, reason="a cold mypy run over odb and torch's types")
@pytest.mark.timeout(600)
def test_mypy_passes_on_odb() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],  # files and flags from pyproject.toml
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    checked = re.search(r"no issues found in (\d+) source files", proc.stdout)
    modules = len(list((ROOT / "odb").rglob("*.py")))
    assert checked and int(checked.group(1)) == modules, proc.stdout
