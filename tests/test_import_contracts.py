"""The import contracts of ``pyproject.toml`` hold, and each of them can break.

``lint-imports`` (import-linter) checks the layout: ``odb/core`` pure, ``odb/_process``
private, the baselines on ``odb`` and ``odb.kit``, no cycles. The second test runs the
same configuration over a small tree that breaks every contract, so a contract that
cannot fail (misspelt module, wrong root package) fails this suite instead of passing
silently. ``examples/`` is scripts, not a package, so its imports are checked here.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# A tree with odb's layout in which every contract is broken once.
BROKEN_TREE = {
    "odb/__init__.py": "",
    "odb/loader.py": "",
    "odb/wrapping.py": "import odb.kit\n",  # independent layers import each other
    "odb/collate.py": "",
    "odb/resumable.py": "",
    "odb/kit.py": "",
    "odb/integrations/__init__.py": "",
    "odb/planning/__init__.py": "",
    "odb/_process/__init__.py": "",
    "odb/_process/messages.py": "import odb.core.steps\n",
    "odb/core/__init__.py": "",
    "odb/core/steps.py": "import os\nimport torch\nfrom torch import distributed\n",
    "odb/core/rounds.py": "import odb._process.messages\nimport odb.core.budget\n",
    "odb/core/budget.py": "import odb.core.rounds\n",  # a cycle inside odb.core
    "baselines/__init__.py": "import odb\nimport odb.loader\nfrom odb.core import budget\n",
    "experiments/__init__.py": "from odb._process import messages\nimport eval\n",  # upward
    "eval/__init__.py": "",
    "paper/__init__.py": "",
    "bench/__init__.py": "",
    "harness/__init__.py": "import tests\n",  # a non-test package importing the tests
}


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, f"lint-imports failed:\n{result.stdout}\n{result.stderr}"
    assert f"{len(CONFIG['contracts'])} kept, 0 broken" in result.stdout, result.stdout


def test_every_contract_breaks_on_a_tree_that_breaks_it(tmp_path: Path) -> None:
    for name, text in BROKEN_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "import_contracts.py", tmp_path / "tests")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    result = _lint_imports(tmp_path)
    report = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 1, report
    verdict = r"^(.+?)\s+BROKEN(?: \(\d+ warnings?\))?$"  # warnings: an unmatched exception
    broken = re.findall(verdict, result.stdout, flags=re.MULTILINE)
    names = [" ".join(c["name"].split()) for c in CONFIG["contracts"]]
    unbroken = [name for name in names if name not in [" ".join(b.split()) for b in broken]]
    assert not unbroken, f"contracts the broken tree did not break: {unbroken}\n{report}"


def test_examples_import_only_odb_its_kit_and_integrations() -> None:
    allowed = re.compile(r"odb(\.kit|\.integrations(\.\w+)?)?$")
    found = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            found += [
                f"{path.name}:{node.lineno} {m}"
                for m in modules
                if m.split(".")[0] == "odb" and not allowed.match(m)
            ]
    assert not found, f"examples import odb internals: {found}"
